"""The node agent: one process per node, started by the node's first rank.

`python -m toolkit.telemetry.agent` reads its `AgentSpec` (toolkit.telemetry.spec) from stdin, binds the
node's socket, samples the sources every interval, receives the ranks' step records and
events, and flushes everything into the node file every flush interval. It stops when every
local rank said goodbye (or a few seconds after its parent did), when its parent process is
gone, or on SIGTERM, and always flushes before it exits. Ctrl-C is ignored: the ranks decide.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

from toolkit.config.telemetry import TelemetryConfig
from toolkit.redact import redact, redact_text
from toolkit.telemetry.agent_status import write_status
from toolkit.telemetry.h5store import NodeFileWriter
from toolkit.telemetry.schema import (
    EVENT_ATTRS_BYTES,
    TIME,
    Column,
    TableSpec,
    events_spec,
    node_file_name,
    steps_spec,
    telemetry_dir,
)
from toolkit.telemetry.sources import Source
from toolkit.telemetry.sources.host import HostSource
from toolkit.telemetry.sources.infiniband import InfinibandSource
from toolkit.telemetry.sources.nvml import NvmlSource
from toolkit.telemetry.spec import AgentSpec
from toolkit.telemetry.transport import Receiver
from toolkit.telemetry.watchdog import Watchdog

log = logging.getLogger("toolkit.telemetry.agent")

GOODBYE_GRACE_S = 3.0  # after the parent rank's goodbye, wait this long for the others
# On SIGTERM (Slurm signals every process of the step at preemption or time limit) the agent
# flushes at once, then keeps recording the ranks' last steps and events for this long, or
# until they close or die, whichever comes first.
TERM_GRACE_S = 20.0
AGENT_COLUMNS = [
    TIME,
    Column("sample_duration_s", "f4", "s"),
    Column("flush_duration_s", "f4", "s"),
    Column("messages", "i8", "count since start"),
]


def free_file(directory: Path, node: str, attempt: int) -> tuple[Path, int]:
    """The node file for this attempt; a local re-run into the same run dir takes the next
    free attempt number instead of overwriting."""
    while (directory / node_file_name(node, attempt)).exists():
        attempt += 1
    return directory / node_file_name(node, attempt), attempt


def open_sources(cfg: TelemetryConfig) -> tuple[list[Source], dict[str, str]]:
    sources: list[Source] = []
    absent: dict[str, str] = {}
    candidates: list[tuple[str, bool, Any]] = [
        ("gpu", cfg.gpu, lambda: NvmlSource(gpm=cfg.gpm, interval_s=cfg.interval_s)),
        ("host", cfg.host, HostSource),
        ("ib", cfg.infiniband, lambda: InfinibandSource(cfg.sysfs_root)),
    ]
    for name, enabled, build in candidates:
        if not enabled:
            absent[name] = f"disabled (telemetry.{'infiniband' if name == 'ib' else name}=false)"
            continue
        try:
            source = build()
        except Exception as exc:  # noqa: BLE001 - a broken source leaves its group out
            absent[name] = f"{type(exc).__name__}: {exc}"
            continue
        if source.absent_reason:
            absent[name] = source.absent_reason
            continue
        sources.append(source)
    return sources, absent


class Agent:
    def __init__(
        self,
        spec: AgentSpec,
        sources: list[Source],
        absent: dict[str, str],
        receiver: Receiver,
    ):
        self.spec = spec
        self.cfg = spec.config
        self.sources = sources
        self.receiver = receiver
        self._last_sample_s: float | None = None
        self.stop_reason: str | None = None
        self.goodbyes: set[int] = set()
        self.goodbye_deadline: float | None = None
        self.term_requested = False  # set by the SIGTERM handler (which does nothing else)
        self.terminated_at: float | None = None
        self.messages = 0
        self.unknown_ranks: set[int] = set()
        self._told_dropped = 0  # rows dropped that the rank was told of
        self.watchdog = Watchdog(spec, spec.watchdog) if spec.watchdog is not None else None
        directory = telemetry_dir(Path(spec.run_dir))
        self.path, self.attempt = free_file(directory, spec.node, spec.attempt)
        specs: list[TableSpec] = []
        for source in sources:
            specs += source.specs()
        specs += [steps_spec(r) for r in spec.ranks]
        specs += [events_spec(), TableSpec("agent", AGENT_COLUMNS)]
        self.writer = NodeFileWriter(
            self.path,
            specs,
            self._file_attrs(absent),
            compression=self.cfg.compression,
            compression_level=self.cfg.compression_level,
            chunk_rows=self.cfg.chunk_rows,
        )
        self.tables = set(self.writer.tables)
        log.info("telemetry agent writing %s (sources: %s)", self.path, [s.name for s in sources])

    def _file_attrs(self, absent: dict[str, str]) -> dict[str, Any]:
        spec = self.spec
        config_path = Path(spec.run_dir) / "config.yaml"
        attrs: dict[str, Any] = {
            "job_id": spec.job_id or "",
            "attempt": self.attempt,
            "slurm_restart_count": spec.attempt,
            "node": spec.node,
            "node_rank": spec.node_rank,
            "ranks": list(spec.ranks),
            "world_size": spec.world_size,
            "num_nodes": spec.num_nodes,
            "created_unix_s": time.time(),
            "interval_s": self.cfg.interval_s,
            "flush_interval_s": self.cfg.flush_interval_s,
            "nccl_env": redact(spec.nccl_env),
            "config_yaml": redact_text(config_path.read_text()) if config_path.exists() else "",
            "telemetry_config": redact(dataclasses.asdict(spec.config)),
            "python_version": sys.version.split()[0],
        }
        for key in ("torch", "cuda", "nccl"):
            attrs[f"{key}_version"] = spec.versions.get(key) or ""
        for source in self.sources:
            attrs.update(getattr(source, "attrs", {}))
        for name, reason in absent.items():
            attrs[f"{name}_absent_reason"] = reason
        return attrs

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> None:
        interval = self.cfg.interval_s
        next_sample = time.time()
        next_flush = next_sample + self.cfg.flush_interval_s
        try:
            while self.stop_reason is None:
                now = time.time()
                wait = max(0.0, min(next_sample, next_flush) - now)
                try:
                    ready, _, _ = select.select([self.receiver], [], [], min(wait, 0.5))
                except InterruptedError:
                    ready = []
                if ready:
                    self.handle(self.receiver.receive())
                now = time.time()
                if now >= next_sample:
                    self.sample(now)
                    next_sample += interval
                    if next_sample <= now:  # fell behind: skip, never burst
                        next_sample = now + interval
                first_term = self.term_requested and self.terminated_at is None
                if first_term:
                    self.terminated_at = now
                if now >= next_flush or first_term:
                    self.flush(now)
                    next_flush = now + self.cfg.flush_interval_s
                if self.stop_reason is None:
                    self.watch(now)
                self.check_stop(now)
        finally:
            self.close()

    def sample(self, now: float) -> None:
        t0 = time.perf_counter()
        for source in self.sources:
            try:
                rows = source.sample(now)
                for table, row in rows.items():
                    if table in self.tables:
                        self.writer.append(table, {"time": now, **row})
                for event in source.events(now):
                    self.write_event({"rank": -1, "step": -1, **event})
            except Exception:  # noqa: BLE001 - a source failing leaves a gap, nothing more
                log.exception("telemetry source %s failed", source.name)
        self._last_sample_s = time.perf_counter() - t0

    def flush(self, now: float) -> None:
        t0 = time.perf_counter()
        try:
            self.writer.flush()
        except Exception:  # noqa: BLE001
            log.exception("telemetry flush failed")
        self.tell_rank()
        self.writer.append(
            "agent",
            {
                "time": now,
                "sample_duration_s": self._last_sample_s,
                "flush_duration_s": time.perf_counter() - t0,
                "messages": self.messages,
            },
        )

    def tell_rank(self) -> None:
        """Rows that could not be written (a full disk): tell the rank that started this
        agent (toolkit.telemetry.agent_status), whenever more were dropped."""
        dropped = self.writer.rows_dropped
        if dropped == self._told_dropped:
            return
        status = {
            "node": self.spec.node,
            "path": str(self.path),
            "error": self.writer.write_error,
            "dropped": dict(self.writer.dropped),
        }
        if write_status(self.spec.socket, status):
            self._told_dropped = dropped
        elif self._told_dropped >= 0:
            self._told_dropped = -1  # say once that the rank cannot be told either
            log.error("telemetry: could not tell the rank about the dropped rows either")

    def watch(self, now: float) -> None:
        """The hang watchdog's turn; after a hang, flush what the ranks sent and stop."""
        if self.watchdog is None:
            return
        stop = self.watchdog.poll(now)
        if stop is None:
            return
        summary = self.watchdog.summary
        if summary is not None:
            self.write_event(
                {
                    "name": "hang",
                    "start": summary["time_unix"] - summary["stuck_for_s"],
                    "end": summary["time_unix"],
                    "step": summary["step"],
                    "rank": -1,
                    "attrs": {
                        k: summary[k]
                        for k in (
                            "stuck_ranks",
                            "stuck_hosts",
                            "collective",
                            "stuck_for_s",
                            "message",
                            "action",
                        )
                    },
                }
            )
        self.stop_reason = stop

    def handle(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            self.messages += 1
            try:
                kind = m.pop("kind")
                if kind == "step":
                    self.write_step(m)
                    if self.watchdog is not None:
                        self.watchdog.note_step(m.get("step_time_s", 0.0))
                elif kind == "event":
                    self.write_event(m)
                elif kind == "goodbye":
                    self.goodbyes.add(int(m["rank"]))
                    if self.watchdog is not None:
                        self.watchdog.note_goodbye(int(m["rank"]))
                    if m.get("owner"):
                        self.goodbye_deadline = time.time() + GOODBYE_GRACE_S
            except Exception:  # noqa: BLE001 - a malformed message is skipped
                log.exception("telemetry: bad message skipped: %.200s", m)

    def write_step(self, m: dict[str, Any]) -> None:
        table = f"steps/rank{int(m['rank'])}"
        if table not in self.tables:
            if m["rank"] not in self.unknown_ranks:
                self.unknown_ranks.add(m["rank"])
                log.warning("telemetry: rank %s is not on this node's list; dropped", m["rank"])
            return
        self.writer.append(table, m)

    def write_event(self, m: dict[str, Any]) -> None:
        attrs = json.dumps(m.get("attrs") or {}, default=str).encode()
        if len(attrs) > EVENT_ATTRS_BYTES:
            attrs = json.dumps({"truncated": True}).encode()
        self.writer.append(
            "events",
            {
                "start": m["start"],
                "end": m["end"],
                "step": m.get("step", -1),
                "rank": m.get("rank", -1),
                "name": str(m["name"]).encode()[:64],
                "attrs": attrs,
            },
        )

    def check_stop(self, now: float) -> None:
        if self.stop_reason is not None:
            return
        if set(self.spec.ranks) <= self.goodbyes:
            self.stop_reason = "every local rank closed"
        elif self.goodbye_deadline is not None and now >= self.goodbye_deadline:
            missing = sorted(set(self.spec.ranks) - self.goodbyes)
            self.stop_reason = f"parent rank closed; no goodbye from ranks {missing}"
        elif os.getppid() != self.spec.parent_pid:
            self.stop_reason = "parent rank process is gone"
        elif self.terminated_at is not None and now - self.terminated_at >= TERM_GRACE_S:
            self.stop_reason = f"SIGTERM {TERM_GRACE_S:.0f} s ago"

    def close(self) -> None:
        with contextlib.suppress(Exception):  # best effort
            self.handle(self.receiver.receive())
            self.flush(time.time())
        self.writer.close()
        self.receiver.close()
        for source in self.sources:
            source.close()
        log.info("telemetry agent stopped (%s): %s", self.stop_reason, self.path)


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s telemetry-agent %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = AgentSpec.from_json(sys.stdin.read())
    receiver = Receiver(spec.socket)  # bind first: ranks may already be sending
    sources, absent = open_sources(spec.config)
    agent = Agent(spec, sources, absent, receiver)

    def on_term(_signum: int, _frame: Any) -> None:
        agent.term_requested = True  # the loop flushes at once and starts the grace period

    signal.signal(signal.SIGTERM, on_term)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
