"""The hang watchdog, inside each node's telemetry agent.

Every POLL_S the agent calls `Watchdog.poll`: it reads each local rank's heartbeat
(toolkit.telemetry.heartbeat) and notes when its progress counter last moved. A rank whose
counter has not moved for the timeout of its phase is hung (fault.hang_timeout_s; startup,
the first step and hooks such as checkpoint saves and loads get hang_startup_timeout_s).
Ranks that said goodbye, reached the end of the loop, or whose process is gone are not
watched: a crash is the launcher's to report, not a hang.

Then, on every node (the agents meet in RUN_DIR/hangs/, a shared directory):

1. the first agent to see the hang claims it (an O_EXCL file naming the hang directory);
   the others find the claim when they poll and join;
2. each agent sends DUMP_SIGNAL to its local ranks (every thread's stack, written from C
   even while a rank is blocked) and moves the dumps into the hang directory, with a
   node-<host>.json of what its ranks' heartbeats said;
3. the claiming agent waits for every node's file (at most GATHER_S), names the stuck ranks
   (toolkit.fault.hang.diagnose), writes summary.json and the one line, and runs the
   after-hang action (toolkit.executors.after_hang: requeue under Slurm, without the stuck
   node) as its own process, then records what it did in the summary;
4. every agent ends its local ranks (SIGKILL: a hung rank runs no Python, and SIGTERM is
   the preemption signal) and stops; the others wait for step 3's action first, since a
   killed rank ends the job step, and with it the requeue in progress. The launcher turns
   that into exit status 79.

Nothing here can stall a rank: the ranks only write their heartbeat; all the waiting is
the agent's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from toolkit.fault.hang import (
    DUMP_SIGNAL,
    SUMMARY,
    collective_in_stacks,
    diagnose,
    hangs_dir,
    new_hang_dir,
    one_line,
    pending_stack_file,
    write_hang_summary,
)
from toolkit.files import write_private
from toolkit.telemetry.heartbeat import LONG_PHASES, heartbeat_path, read_heartbeat
from toolkit.telemetry.spec import AgentSpec, WatchdogSpec

log = logging.getLogger("toolkit.telemetry.watchdog")

POLL_S = 0.5  # heartbeat reads
CLAIM_POLL_S = 1.0  # looks for another node's claim (a stat on the shared run dir)
DUMP_WAIT_S = 2.0  # after the signal, for the ranks' stacks to be written
GATHER_S = 15.0  # the claiming agent waits this long at most for the other nodes' files
SUMMARY_WAIT_S = 30.0  # the other agents wait this long at most for the summary
MIN_DEFAULT_TIMEOUT_S = 300.0
STEP_TIMES_KEPT = 200
AFTER_HANG_TIMEOUT_S = 120.0  # the after-hang action (scontrol requeue and update)


def default_timeout_s(step_times: list[float]) -> float:
    """max(5 min, 10 x the median step time); 5 min while no step time is known."""
    if not step_times:
        return MIN_DEFAULT_TIMEOUT_S
    return max(MIN_DEFAULT_TIMEOUT_S, 10.0 * statistics.median(step_times))


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dumped(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def poke_flight_recorder(rank: int) -> bool:
    """Ask PyTorch's NCCL monitor of `rank` to dump its flight recorder now: one byte into
    the rank's FIFO (TORCH_NCCL_DEBUG_INFO_PIPE_FILE, inherited from the rank that started
    this agent; toolkit.nccl sets it on GPU). False when there is none (gloo, CPU, an older
    PyTorch) or nobody reads it."""
    stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if not stem:
        return False
    try:
        fd = os.open(f"{stem}{rank}.pipe", os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # absent, or ENXIO: no reader
        return False
    try:
        os.write(fd, b"1")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def copy_flight_recorder(rank: int, directory: Path, since_unix: float) -> None:
    """The rank's flight-recorder dump (TORCH_FR_DUMP_TEMP_FILE<rank>, PyTorch's own
    format: copied as bytes, never loaded here) into the hang directory, when one was
    written for this hang."""
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        stem = os.environ.get(name)
        source = Path(f"{stem}{rank}") if stem else None
        with contextlib.suppress(OSError):
            if source is not None and source.stat().st_mtime >= since_unix - 1.0:
                target = directory / f"nccl-flight-recorder-rank{rank}"
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(source.read_bytes())
                return


class Watchdog:
    def __init__(self, spec: AgentSpec, settings: WatchdogSpec):
        self.spec = spec
        self.settings = settings
        self.run_dir = Path(spec.run_dir)
        self.host = spec.node
        self.paths = {r: heartbeat_path(spec.socket, r) for r in spec.ranks}
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (progress, when it last moved)
        self.beats: dict[int, dict[str, Any]] = {}
        self.step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self.closed: set[int] = set()  # ranks that said goodbye
        key = f"{spec.job_id}|{spec.attempt}|{self.run_dir.resolve()}".encode()
        self.claim = hangs_dir(self.run_dir) / f".claim-{hashlib.sha1(key).hexdigest()[:12]}"
        self._next_poll = 0.0
        self._next_claim_check = 0.0
        self.summary: dict[str, Any] | None = None
        self.hang_dir: Path | None = None

    # -- what the agent tells it ---------------------------------------------------------
    def note_step(self, step_time_s: float) -> None:
        if step_time_s > 0:
            self.step_times.append(float(step_time_s))

    def note_goodbye(self, rank: int) -> None:
        self.closed.add(rank)

    # -- watching ------------------------------------------------------------------------
    def timeout_s(self, phase: str) -> float:
        if phase in LONG_PHASES:
            return self.settings.startup_timeout_s
        if self.settings.timeout_s is not None:
            return self.settings.timeout_s
        return default_timeout_s(list(self.step_times))

    def poll(self, now: float) -> str | None:
        """Watch; on a hang (here or on another node) handle it and return the agent's stop
        reason. Never raises: a failure to read is logged and watching goes on; a failure
        while handling a hang (a full disk for the evidence) still ends the local ranks,
        since the hang itself was seen."""
        if now < self._next_poll:
            return None
        self._next_poll = now + POLL_S
        try:
            hung = self._hung_ranks(now)
            joined = False
            if not hung and now >= self._next_claim_check:
                self._next_claim_check = now + CLAIM_POLL_S
                joined = self.claim.exists()
        except Exception:  # noqa: BLE001 - the watchdog must never take the agent down
            log.exception("hang watchdog failed; still watching")
            return None
        if not hung and not joined:
            return None
        try:
            if hung:
                log.warning("hang watchdog: no progress from ranks %s", hung)
                return self.handle(leader=self._try_claim(now))
            log.warning("hang watchdog: another node declared a hang; dumping here too")
            return self.handle(leader=False)
        except Exception as exc:  # noqa: BLE001
            log.exception("hang watchdog: could not keep the evidence; ending the ranks")
            self.kill_local_ranks()
            return f"hang: ranks ended without full evidence ({type(exc).__name__}: {exc})"

    def _hung_ranks(self, now: float) -> list[int]:
        hung = []
        for rank, path in self.paths.items():
            beat = read_heartbeat(path)
            if beat is None or rank in self.closed:
                continue
            self.beats[rank] = beat
            progress, since = self.seen.get(rank, (-1, now))
            if beat["progress"] != progress:
                self.seen[rank] = (beat["progress"], now)
                continue
            if beat["phase"] == "end" or not pid_alive(beat["pid"]):
                continue
            if now - since >= self.timeout_s(beat["phase"]):
                hung.append(rank)
        return hung

    # -- a hang --------------------------------------------------------------------------
    def _try_claim(self, now: float) -> bool:
        """True when this agent is the first to declare the hang (it writes the summary)."""
        hangs_dir(self.run_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        directory = new_hang_dir(self.run_dir, time.time())
        with os.fdopen(fd, "w") as f:
            f.write(directory.name)
        self.hang_dir = directory
        return True

    def _claimed_dir(self, deadline: float) -> Path | None:
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                name = self.claim.read_text().strip()
                if name:
                    return hangs_dir(self.run_dir) / name
            time.sleep(0.1)
        return None

    def handle(self, leader: bool) -> str:
        now = time.time()
        if self.hang_dir is None:
            self.hang_dir = self._claimed_dir(now + 10.0)
        directory = self.hang_dir
        if directory is None:
            self.kill_local_ranks()
            return "hang declared elsewhere; its directory never appeared"
        self.dump_local_ranks(directory)
        if leader:
            summary = self.summarise(directory)
            self.summary = summary
            line = summary["message"]
            log.error("%s", line)
            print(line, flush=True)
        else:
            # Not before the leader's after-hang action is done: a rank killed here ends the
            # job step (srun), and with it the leader's requeue before it happens.
            self._wait_for_action(directory / SUMMARY, SUMMARY_WAIT_S + AFTER_HANG_TIMEOUT_S)
        self.kill_local_ranks()
        return f"hang: evidence in {directory}"

    def snapshot(self) -> list[dict[str, Any]]:
        """What this node's ranks' heartbeats say now (idle_s by this agent's clock)."""
        now = time.time()
        out = []
        for rank, path in self.paths.items():
            beat = read_heartbeat(path) or self.beats.get(rank)
            if beat is None or rank in self.closed:  # a rank that ended is not hung
                continue
            moved = self.seen.get(rank, (0, now))[1]  # wall clock: compares across nodes
            idle = {"idle_s": now - moved, "moved_unix": moved}
            out.append({"rank": rank, "host": self.host, **beat, **idle})
        return out

    def dump_local_ranks(self, directory: Path) -> None:
        ranks = self.snapshot()  # before the signal: the dumps move no counter, but be sure
        asked = time.time()
        poked = False
        for r in ranks:
            if pid_alive(r["pid"]):
                with contextlib.suppress(OSError):
                    os.kill(r["pid"], DUMP_SIGNAL)
                poked = poke_flight_recorder(r["rank"]) or poked
        # Stacks are written at once (from the signal handler); a flight recorder dump
        # waits for PyTorch's monitor thread: then the whole DUMP_WAIT_S.
        files = [pending_stack_file(self.run_dir, r["rank"], r["pid"]) for r in ranks]
        while time.time() < asked + DUMP_WAIT_S and (poked or not all(map(dumped, files))):
            time.sleep(0.1)
        time.sleep(0.1)  # the last lines of a dump in progress
        for r in ranks:
            pending = pending_stack_file(self.run_dir, r["rank"], r["pid"])
            with contextlib.suppress(OSError):
                write_private(directory / f"stacks-rank{r['rank']}.txt", pending.read_text())
                pending.unlink()
            copy_flight_recorder(r["rank"], directory, since_unix=asked)
        node = {"host": self.host, "socket_host": socket.gethostname(), "ranks": ranks}
        write_private(directory / f"node-{self.host}.json", json.dumps(node, indent=2))

    def summarise(self, directory: Path) -> dict[str, Any]:
        self._wait_for_nodes(directory, GATHER_S)
        ranks: list[dict[str, Any]] = []
        nodes = []
        for path in sorted(directory.glob("node-*.json")):
            with contextlib.suppress(OSError, ValueError):
                node = json.loads(path.read_text())
                nodes.append(node["host"])
                ranks += node["ranks"]
        stack_ops = {}
        for r in ranks:  # where each rank's own stacks say it waits (a script's ranks)
            with contextlib.suppress(OSError):
                text = (directory / f"stacks-rank{r['rank']}.txt").read_text()
                stack_ops[r["rank"]] = collective_in_stacks(text)
        summary = diagnose(ranks, stack_ops)
        summary["message"] = one_line(summary, directory)
        summary["time_unix"] = time.time()
        summary["nodes_reporting"] = nodes
        summary["num_nodes"] = self.spec.num_nodes
        summary["world_size"] = self.spec.world_size
        summary["ranks"] = ranks
        summary["stacks"] = sorted(p.name for p in directory.glob("stacks-rank*.txt"))
        summary["nccl_flight_recorder"] = sorted(
            p.name for p in directory.glob("nccl-flight-recorder-rank*")
        )
        summary["job_id"] = self.spec.job_id
        summary["attempt"] = self.spec.attempt
        summary["action"] = "pending"
        write_hang_summary(directory, summary)
        summary["action"] = self._after_hang(summary)
        write_hang_summary(directory, summary)
        return summary

    def _after_hang(self, summary: dict[str, Any]) -> str:
        """Run the job's after-hang action (settings.after_hang_module, e.g. requeue without
        the stuck node) in its own process, under a time limit: whatever it does, the agent
        goes on to end the hung ranks."""
        s = self.settings
        if s.slurm_job_id is None:  # no process to start for nothing
            return "ended (not a Slurm job: nothing to requeue)"
        if not s.after_hang_module:
            return "ended"
        if not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", s.after_hang_module
        ):
            return f"ended (after_hang_module {s.after_hang_module!r} is not a module name)"
        request = {
            "run_dir": str(self.run_dir),
            "summary": summary,
            "slurm_job_id": s.slurm_job_id,
            "requeue": s.requeue,
            "max_restarts": s.max_restarts,
            "nodes": s.nodes,
            "exclude": s.exclude,
            "partition": s.partition,
            "exclude_nodes": s.exclude_nodes,
        }
        try:
            done = subprocess.run(
                [sys.executable, "-m", s.after_hang_module],
                input=json.dumps(request),
                capture_output=True,
                text=True,
                timeout=AFTER_HANG_TIMEOUT_S,
                start_new_session=True,  # signals to the agent's group are not its own
            )
            if done.returncode == 0:
                return str(json.loads(done.stdout.strip().splitlines()[-1])["action"])
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"ended: the after-hang action failed ({tail})"
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError) as exc:
            log.exception("after-hang action failed")
            return f"ended: the after-hang action failed ({type(exc).__name__}: {exc})"

    def _wait_for_nodes(self, directory: Path, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if len(list(directory.glob("node-*.json"))) >= self.spec.num_nodes:
                return
            time.sleep(0.2)
        log.warning("hang watchdog: not every node reported within %.0f s", timeout_s)

    @staticmethod
    def _wait_for_action(path: Path, timeout_s: float) -> None:
        """Until the summary at `path` records what was done (its action no longer pending)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if json.loads(path.read_text()).get("action") not in (None, "pending"):
                    return
            time.sleep(0.2)

    def kill_local_ranks(self) -> None:
        """SIGKILL every local rank still alive (the parent rank last)."""
        pids = [b["pid"] for b in self.snapshot() if b["pid"] != self.spec.parent_pid]
        for pid in [*pids, self.spec.parent_pid]:
            if pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
