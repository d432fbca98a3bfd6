"""The rank side: a `Sink` that forwards step records and events to the node agent.

Every rank gets a `TelemetrySink`; the first rank of each node also starts the node agent
(`toolkit.telemetry.agent`) as a child process and, at close, waits for its final flush.
Nothing here blocks training or raises into it: see `transport.Sender`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolkit.config.telemetry import TelemetryConfig
from toolkit.descendants import spare
from toolkit.distributed.env import DistEnv, restart_count
from toolkit.errors import EXIT_TELEMETRY_LOST
from toolkit.events import Event, StepRecord
from toolkit.hooks import Hook, Stop, TrainerView
from toolkit.telemetry.agent_status import read_status, remove_status, write_failure_line
from toolkit.telemetry.heartbeat import Heartbeat, heartbeat_path
from toolkit.telemetry.schema import node_name
from toolkit.telemetry.spec import AgentSpec, WatchdogSpec
from toolkit.telemetry.transport import Sender, socket_path

log = logging.getLogger(__name__)

STATUS_EVERY_S = 2.0  # how often the rank that started the agent reads its status file


def ranks_by_node(env: DistEnv) -> dict[str, list[int]]:
    """Every node's hostname -> its global ranks (one all_gather at start; every rank calls
    this at the same point, so the collective is safe)."""
    import torch.distributed as dist

    me = (node_name(), env.rank)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, me)
    else:
        gathered = [me]
    nodes: dict[str, list[int]] = {}
    for host, rank in gathered:
        nodes.setdefault(host, []).append(int(rank))
    return {host: sorted(ranks) for host, ranks in nodes.items()}


class TelemetrySink:
    def __init__(
        self,
        cfg: TelemetryConfig,
        rank: int,
        path: str,
        agent: subprocess.Popen | None = None,
        heartbeat: Heartbeat | None = None,
        spec: AgentSpec | None = None,
    ):
        self.cfg = cfg
        self.rank = rank
        self.sender = Sender(path, cfg.max_pending)
        self.agent = agent
        self.heartbeat = heartbeat  # read by the agent's hang watchdog
        self.spec = spec  # how the agent was started: to start it again if it dies
        self.agent_restarts = 0
        self.agent_lost = False  # the agent died and was not started again
        self.path = path
        self._next_status_s = 0.0
        self._rows_dropped_said = 0  # rows the agent could not write, as last said in the log

    def write_step(self, record: StepRecord) -> None:
        self.sender.send({"kind": "step", **dataclasses.asdict(record)})
        if self.agent is not None and self.agent.poll() is not None:  # waitpid, no blocking
            self._agent_died()
        if self.spec is not None and time.monotonic() >= self._next_status_s:
            self._next_status_s = time.monotonic() + STATUS_EVERY_S
            self.say_write_failures(first_only=True)

    def say_write_failures(self, first_only: bool) -> None:
        """The agent could not write rows into the node file (a full disk): say it in one
        line, the first time (and at close, the total when it grew)."""
        status = read_status(self.path)
        if status is None:
            return
        try:
            dropped = sum(int(n) for n in status["dropped"].values())
            line = write_failure_line(status)
        except (KeyError, TypeError, ValueError, AttributeError):
            return
        if dropped > self._rows_dropped_said and not (first_only and self._rows_dropped_said):
            self._rows_dropped_said = dropped
            log.error("%s", line)

    def _agent_died(self) -> None:
        """The node agent exited while training runs: start it again (its records queued in
        the sender reach the new one; its hang watchdog resumes), or go on without it."""
        assert self.agent is not None
        pid, code = self.agent.pid, self.agent.returncode
        if self.spec is None or self.agent_restarts >= self.cfg.agent_restarts:
            then = (
                "the run stops after the next step (telemetry.on_agent_lost=stop)"
                if self.cfg.on_agent_lost == "stop"
                else "no more node telemetry and no hang watchdog"
            )
            log.error(
                "telemetry: node agent (pid %d) exited with %s; not restarted "
                "(telemetry.agent_restarts=%d): %s",
                pid,
                code,
                self.cfg.agent_restarts,
                then,
            )
            self.agent = None
            self.agent_lost = True
            return
        self.agent_restarts += 1
        self.agent = start_agent(self.spec, Path(self.spec.run_dir), self.spec.node)
        log.warning(
            "telemetry: node agent (pid %d) exited with %s; restarted as pid %d (%d of %d); "
            "the records of the time it was down may be missing",
            pid,
            code,
            self.agent.pid,
            self.agent_restarts,
            self.cfg.agent_restarts,
        )

    def write_event(self, event: Event) -> None:
        self.sender.send({"kind": "event", **dataclasses.asdict(event)})

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.close()  # this rank is done: no longer watched
        try:
            if not self.sender.flush(self.cfg.close_timeout_s):
                log.warning(
                    "telemetry: %d records of rank %d not delivered to the node agent",
                    len(self.sender.pending),
                    self.rank,
                )
            if self.sender.dropped:
                log.warning(
                    "telemetry: rank %d dropped %d records (agent unreachable or slow)",
                    self.rank,
                    self.sender.dropped,
                )
            # Goodbye last, best effort: the agent stops once every local rank said it.
            goodbye = {"kind": "goodbye", "rank": self.rank, "owner": self.agent is not None}
            self.sender.send(goodbye)
            self.sender.flush(min(1.0, self.cfg.close_timeout_s))
            self.sender.close()
            if self.agent is not None:
                stop_agent(self.agent, self.cfg.close_timeout_s)
            if self.spec is not None:  # the agent's last word on rows it could not write
                self.say_write_failures(first_only=False)
                remove_status(self.path)
        except Exception:  # noqa: BLE001 - closing telemetry must not fail the run
            log.exception("telemetry: close failed on rank %d", self.rank)


class StopWhenAgentLost(Hook):
    """telemetry.on_agent_lost=stop: once a node agent is gone for good, every rank stops
    after the next step, as at a preemption (the final checkpoint is saved when checkpointing
    is on), with one line and EXIT_TELEMETRY_LOST. The rank that started the agent votes."""

    num_votes = 1

    def __init__(self, sink: TelemetrySink | None, agent_restarts: int):
        self.sink = sink
        self.agent_restarts = agent_restarts

    def votes(self, trainer: TrainerView) -> list[float]:
        return [1.0 if self.sink is not None and self.sink.agent_lost else 0.0]

    def after_step(
        self, trainer: TrainerView, record: StepRecord, votes: list[float]
    ) -> Stop | None:
        if votes[0] <= 0:
            return None
        return Stop(
            f"telemetry: the node agent of {votes[0]:.0f} node(s) died and was not started "
            f"again (telemetry.agent_restarts={self.agent_restarts}); the run stopped after "
            f"step {trainer.step} (telemetry.on_agent_lost=stop): see logs/telemetry-*.log, "
            "relaunch into the run dir to resume",
            exit_code=EXIT_TELEMETRY_LOST,
        )


def stop_agent(agent: subprocess.Popen, timeout_s: float) -> None:
    try:
        agent.wait(timeout=timeout_s)
        return
    except subprocess.TimeoutExpired:
        log.warning(
            "telemetry agent (pid %d) still running after %.0f s; stopping it", agent.pid, timeout_s
        )
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=5)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def start_agent(spec: AgentSpec, run_dir: Path, node: str) -> subprocess.Popen:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"telemetry-{node}.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.telemetry.agent"],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    spare(proc.pid)  # it ends by itself once its rank is gone, after its last flush
    if proc.stdin is not None:  # always, with stdin=PIPE
        proc.stdin.write(spec.to_json().encode())
        proc.stdin.close()
    return proc


def build_telemetry_sinks(
    cfg: TelemetryConfig,
    env: DistEnv,
    run_dir: Path,
    watchdog: WatchdogSpec | None = None,
    nodes: dict[str, list[int]] | None = None,
) -> list[Any]:
    """The telemetry sink of this rank ([] when telemetry is off). Call on every rank.
    With `watchdog`, the node agent watches this rank's heartbeat (`sink.heartbeat`) for
    hangs. `nodes` (hostname -> its global ranks) when known; else one all_gather finds it."""
    if not cfg.enabled:
        return []
    try:
        nodes = ranks_by_node(env) if nodes is None else nodes
        node = node_name()
        ranks = nodes.get(node, [env.rank])
        restart = restart_count()
        path = socket_path(run_dir, node, env.job_id, restart)
        agent = None
        heartbeat = None
        if watchdog is not None:  # before the agent starts: it reads it from its first poll
            heartbeat = Heartbeat(heartbeat_path(path, env.rank))
        if env.rank == min(ranks):
            from toolkit.runinfo import torch_versions

            spec = AgentSpec(
                run_dir=str(run_dir),
                node=node,
                attempt=restart,
                job_id=env.job_id,
                node_rank=env.node_rank,
                ranks=ranks,
                world_size=env.world_size,
                # `nodes` may list this node alone (a script's wrapper has no process group)
                num_nodes=max(len(nodes), env.num_nodes),
                socket=path,
                parent_pid=os.getpid(),
                config=cfg,
                versions=torch_versions(),
                nccl_env={k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                watchdog=watchdog,
            )
            agent = start_agent(spec, run_dir, node)
            return [TelemetrySink(cfg, env.rank, path, agent, heartbeat, spec)]
        return [TelemetrySink(cfg, env.rank, path, agent, heartbeat)]
    except Exception:  # noqa: BLE001 - no telemetry is better than no training
        log.exception("telemetry: could not start on rank %d; continuing without it", env.rank)
        return []
