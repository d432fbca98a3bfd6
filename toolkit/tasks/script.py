"""task=script: every rank runs your own script, with torchrun's environment, and gives it
the toolkit's machinery.

The script runs in the rank's own process (`run_here`: one interpreter start per rank, the
torch the rank server imported already there), as `python FILE ARGS` runs it; where
script.python names another interpreter, as the rank's child (`run_child`). The rank does
not join a process group (the script does, from RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). It
- starts the node's telemetry agent (the first rank of each node), which samples GPU/host/IB
  into the node's HDF5 file and runs the hang watchdog on this rank's heartbeat;
- beats that heartbeat for the script: at process level (new output or CPU time of the
  script), or at step resolution once the script calls toolkit.session.heartbeat();
- lets a preemption signal (cluster.signal, SIGTERM) end the script as it would end
  `python FILE` (a child: forwards it), unless the script handles it (toolkit.session) and,
  on Slurm, requeues the job under checkpoint.requeue / checkpoint.max_restarts when the
  script asked for it (toolkit.session.requeue) or was ended by the signal, but not when the
  signal is Slurm ending the step because a rank's script failed first (`note_failure`);
- ends with the script's exit status; what the script started (forked children, setsid
  daemons) ends with it (toolkit.descendants: this process is their child subreaper).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from toolkit import descendants
from toolkit.config.job import JobConfig
from toolkit.distributed.env import DistEnv, restart_count
from toolkit.errors import EXIT_PREEMPTED
from toolkit.executors import log_cap
from toolkit.executors.preemption import signal_number, slurm_job_id
from toolkit.executors.requeue import RequeuePolicy
from toolkit.files import write_private
from toolkit.redact import redact_text
from toolkit.session import BEAT, ENV, REQUEST, SessionSpec
from toolkit.slurm_cli import requeue
from toolkit.telemetry.schema import node_name
from toolkit.telemetry.sink import TelemetrySink, build_telemetry_sinks
from toolkit.telemetry.transport import socket_path

log = logging.getLogger(__name__)

POLL_S = 0.2
# A failing script's wrapper waits this long for a signal before it records the failure as
# the script's own: a preemption signal that reaches this node late still counts as one.
SIGNAL_GRACE_S = 1.0
CPU_PROGRESS_S = 0.05  # CPU seconds of the script since its last move that count as progress
CPU_PROGRESS_SHARE = 0.02  # ... if also this share of a core over that time
_PR_SET_PDEATHSIG = 1


def command(job: JobConfig, run_dir: Path) -> list[str]:
    """The child's command line: the toolkit's runner, which runs the script as __main__."""
    cfg = job.script
    target = ["--module", cfg.module] if cfg.module else ["--path", str(Path(cfg.path).resolve())]
    runner = [cfg.python or sys.executable, "-m", "toolkit.tasks.script_runner", str(run_dir)]
    return [*runner, *target, "--", *map(str, cfg.args)]


def torchrun_env(env: DistEnv) -> dict[str, str]:
    """The variables torchrun gives each of its workers."""
    return {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "GROUP_RANK": str(env.node_rank),
        "NODE_RANK": str(env.node_rank),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
    }


def node_ranks(env: DistEnv) -> dict[str, list[int]]:
    """This node's global ranks without a collective: a block of local_world_size ranks
    (torchrun's layout and srun's default block distribution)."""
    first = env.node_rank * env.local_world_size
    return {node_name(): list(range(first, first + env.local_world_size))}


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pump(src: BinaryIO, dst: BinaryIO, seen: list[int], copy: BinaryIO | None = None) -> None:
    """Copy the script's output to this rank's own stream (and to `copy`, the run dir's
    file of it when that stream is a terminal), counting it (progress)."""
    for chunk in iter(lambda: src.read1(65536), b""):
        seen[0] += len(chunk)
        for out in (dst, copy) if copy is not None else (dst,):
            with contextlib.suppress(OSError, ValueError):
                out.write(chunk)
                out.flush()
                log_cap.check(out.fileno())  # launch.max_log_bytes: rotated past the cap


def kept_copy(
    stream: BinaryIO, run_dir: Path, rank: int, kind: str, max_bytes: int = 0
) -> BinaryIO | None:
    """RUN_DIR/logs/rank<k>.<kind> (appended, 0600) when `stream` is not already a file in the
    run dir: rank 0 followed on a terminal (or a pipe, or an sbatch --output elsewhere) keeps
    its output in the run dir as well. None when the stream is the run dir's own file."""
    try:
        st = os.fstat(stream.fileno())
        logs = (run_dir / "logs").resolve()
        if stat.S_ISREG(st.st_mode):
            for f in (*logs.glob("*"), *(run_dir / "slurm").glob("*")):
                with contextlib.suppress(OSError):
                    if os.path.samestat(st, f.stat()):
                        return None
        logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(logs / f"rank{rank}.{kind}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        log_cap.cap(fd, run_dir, max_bytes)  # rotated past launch.max_log_bytes
        return os.fdopen(fd, "ab")
    except (OSError, ValueError):
        return None


def cpu_time_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (its own threads), 0 when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class Progress:
    """Process-level progress (output, CPU time) until the script beats itself."""

    def __init__(self, beat_path: Path):
        self.beat_path = beat_path
        self.last: tuple[int, float, int] = (0, 0.0, 0)  # at the last move
        self.moved_at = time.monotonic()
        self.step = 0
        self.stepwise = False  # the script calls toolkit.session.heartbeat()

    def moved(self, output_bytes: int, cpu_s: float) -> bool:
        beats, step = 0, self.step
        with contextlib.suppress(OSError, Exception):
            data = self.beat_path.read_bytes()
            if len(data) >= BEAT.size:
                beats, step = BEAT.unpack(data[: BEAT.size])
        out0, cpu0, beats0 = self.last
        self.step = step
        if beats:
            self.last = (output_bytes, cpu_s, beats)
            self.stepwise = True
            return beats != beats0
        # CPU time counts from the last move, not the last poll: a script that gets a tenth
        # of a core on a loaded machine (importing, say) still moves every few polls; one
        # blocked in a collective, whose threads use a few ms a second, does not.
        now = time.monotonic()
        cpu = cpu_s - cpu0
        moved = output_bytes != out0 or (
            cpu >= CPU_PROGRESS_S and cpu >= CPU_PROGRESS_SHARE * (now - self.moved_at)
        )
        if moved:
            self.last, self.moved_at = (output_bytes, cpu_s, beats), now
        return moved


def run(job: JobConfig, env: DistEnv, run_dir: Path, device: Any = None) -> dict[str, Any]:
    from toolkit.tasks.watchdog import watchdog_spec

    attempt = restart_count()
    sinks = build_telemetry_sinks(
        job.telemetry, env, run_dir, watchdog_spec(job, env), nodes=node_ranks(env)
    )
    sink = next((s for s in sinks if isinstance(s, TelemetrySink)), None)
    hb = sink.heartbeat if sink is not None else None
    private = Path(socket_path(run_dir, node_name(), env.job_id, attempt)).parent
    private.mkdir(parents=True, exist_ok=True, mode=0o700)
    beat_path = private / f"script.rank{env.rank}.beat"
    beat_path.unlink(missing_ok=True)
    signals = sorted({signal_number(job.cluster.signal), int(signal.SIGTERM)})
    spec = SessionSpec(
        run_dir=str(run_dir),
        rank=env.rank,
        attempt=attempt,
        checkpoint_dir=str(run_dir / "checkpoints"),
        beat_path=str(beat_path),
        socket=sink.sender.path if sink is not None else None,
        stop_signals=signals,
    )
    if env.is_rank0:
        (run_dir / REQUEST).unlink(missing_ok=True)
        if attempt > 0:
            note_restart(run_dir, attempt)
    log.info("rank %d runs %s", env.rank, redact_text(job.script.command_line()))
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _f: received.append(signum)) for s in signals}
    try:
        here = in_this_process(job)
        started = run_here if here else run_child
        try:
            code = started(job, env, run_dir, spec, hb, received)
        finally:
            for s in sinks:
                s.close()
            beat_path.unlink(missing_ok=True)
        signalled = bool(received) or (here and stopped_by_session())
        if code != 0 and not signalled:
            note_failure(run_dir, env, attempt, code, received)
        # Still under the handlers: `scontrol requeue` SIGTERMs this job while rank 0 is yet
        # to make the requeued job eligible now (Slurm would hold it ~120 s).
        code = after_script(job, env, run_dir, code, signalled)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if env.is_rank0:
        write_summary(run_dir, code)
    return {"exit_code": code}


def in_this_process(job: JobConfig) -> bool:
    """Whether the script runs in this rank's own process (its interpreter is this one: no
    second interpreter start, torch already imported), or as its child (script.python names
    another interpreter)."""
    if not job.script.python:
        return True
    with contextlib.suppress(OSError):
        return Path(job.script.python).resolve() == Path(sys.executable).resolve()
    return False


def stopped_by_session() -> bool:
    """Whether a preemption signal reached the script's toolkit.session (its handler, not
    this wrapper's, took it)."""
    session = sys.modules.get("toolkit.session")
    current = getattr(session, "_session", None)
    return current is not None and current.stop_signum is not None


def run_child(
    job: JobConfig, env: DistEnv, run_dir: Path, spec: SessionSpec, hb: Any, received: list[int]
) -> int:
    """The script in a child process (another interpreter): the signals forwarded, its
    output pumped to this rank's streams; its exit status."""
    child_env = os.environ | torchrun_env(env) | {ENV: spec.to_env(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command(job, run_dir),
        env=child_env,
        cwd=job.script.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl: no Python state touched
    )
    if hb is not None:
        hb.pid = proc.pid  # the watchdog dumps and ends the script, not this wrapper
        hb.beat("startup", 0)
    seen = [0]
    streams = ((proc.stdout, sys.stdout.buffer, "out"), (proc.stderr, sys.stderr.buffer, "err"))
    max_bytes = job.launch.max_log_bytes
    copies = [kept_copy(dst, run_dir, env.rank, kind, max_bytes) for _, dst, kind in streams]
    pumps = [
        threading.Thread(target=_pump, args=(src, dst, seen, copy), daemon=True)
        for (src, dst, _), copy in zip(streams, copies, strict=True)
    ]
    for t in pumps:
        t.start()
    progress = Progress(Path(spec.beat_path))
    forwarded = 0
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            while forwarded < len(received):  # the handler only noted it: forward it here
                with contextlib.suppress(OSError):
                    proc.send_signal(received[forwarded])
                forwarded += 1
            if hb is not None and progress.moved(seen[0], cpu_time_s(proc.pid)):
                # Startup (hang_startup_timeout_s) until the script shows a sign of life.
                hb.beat("step", progress.step)
        # What the script started and left running (forked children, setsid daemons,
        # adopted by this rank: a child subreaper) ends with it; they may hold its
        # output pipes open too.
        descendants.end(job.launch.kill_grace_s)
        for t in pumps:
            t.join(timeout=5)
    finally:
        for copy in copies:
            if copy is not None:
                copy.close()
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def run_here(
    job: JobConfig, env: DistEnv, run_dir: Path, spec: SessionSpec, hb: Any, received: list[int]
) -> int:
    """The script in this rank's own process, as `python FILE ARGS` would run it (with
    torchrun's environment): one interpreter start per rank, and the torch this rank (or the
    rank server it was forked from) imported already. Its output goes through a pipe to this
    rank's streams (counted: progress; copied to the run dir for a followed rank 0); a
    thread beats the heartbeat on its progress. A preemption signal the script does not
    handle itself ends it as it would end `python FILE` (exit 128 + the signal), through
    its `finally` blocks. Its exit status."""
    from toolkit.tasks import script_runner

    cfg = job.script
    os.environ.update(torchrun_env(env) | {ENV: spec.to_env()})
    if hb is not None:
        hb.pid = os.getpid()  # the watchdog dumps this process's stacks and ends it
        hb.beat("startup", 0)
    seen = [0]
    redirected = [Redirected(fd, run_dir, env.rank, kind, job.launch.max_log_bytes, seen)
                  for fd, kind in ((1, "out"), (2, "err"))]  # fmt: skip
    done = threading.Event()
    watch = threading.Thread(
        target=_watch_here, args=(Progress(Path(spec.beat_path)), hb, seen, done), daemon=True
    )
    watch.start()

    def stop(signum: int, _frame: Any) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    handlers = {s: signal.signal(s, stop) for s in spec.stop_signals}
    cwd = os.getcwd()
    logging_state = _own_logging()
    argv, path = list(sys.argv), list(sys.path)
    kind, target = ("--module", cfg.module) if cfg.module else ("--path", "")
    target = target or str(Path(cfg.path).resolve())  # as command(): from the launch's cwd
    try:
        if cfg.cwd:
            os.chdir(cfg.cwd)
        try:
            code: Any = script_runner.run_script(
                run_dir, env.rank, kind, target, list(map(str, cfg.args))
            )
        except SystemExit as exit_:
            code = exit_.code
        code = code if isinstance(code, int) else int(code is not None)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        sys.argv[:], sys.path[:] = argv, path
        os.chdir(cwd)
        _restore_logging(logging_state)
        done.set()
        descendants.end(job.launch.kill_grace_s)  # what the script started, as run_child
        for r in redirected:
            r.close()
        watch.join(timeout=5)
    return code


def _watch_here(progress: Progress, hb: Any, seen: list[int], done: threading.Event) -> None:
    if hb is None:
        return
    me = os.getpid()
    while not done.wait(POLL_S):
        if progress.moved(seen[0], cpu_time_s(me)):
            hb.beat("step", progress.step)


class Redirected:
    """Descriptor `fd` (1 or 2) through a pipe for the time of the script: a thread copies
    what it writes to where `fd` pointed (and to the run dir's file of it when that is not a
    file of the run dir: `kept_copy`), counting the bytes (`seen`: progress)."""

    def __init__(
        self, fd: int, run_dir: Path, rank: int, kind: str, max_bytes: int, seen: list[int]
    ):
        self.fd = fd
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self.saved = os.dup(fd)
        log_cap.cap(self.saved, run_dir, max_bytes)  # still rotated past launch.max_log_bytes
        dst = os.fdopen(self.saved, "wb", buffering=0, closefd=False)
        copy = kept_copy(dst, run_dir, rank, kind, max_bytes)
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        src = os.fdopen(read, "rb")
        self.files = [f for f in (dst, copy, src) if f is not None]
        self.pump = threading.Thread(target=_pump, args=(src, dst, seen, copy), daemon=True)
        self.pump.start()

    def close(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(self.saved, self.fd)  # the pipe's last writer here gone: the pump ends
        self.pump.join(timeout=5)
        for f in self.files:
            with contextlib.suppress(OSError):
                f.close()
        with contextlib.suppress(OSError):
            os.close(self.saved)


def _own_logging() -> tuple[list[logging.Handler], int, bool]:
    """The script gets the root logger as a fresh interpreter has it (its basicConfig works);
    the toolkit's own loggers keep this rank's handlers meanwhile."""
    root, own = logging.getLogger(), logging.getLogger("toolkit")
    state = (list(root.handlers), root.level, own.propagate)
    for h in state[0]:
        root.removeHandler(h)
        own.addHandler(h)
    root.setLevel(logging.WARNING)
    own.setLevel(logging.INFO)
    own.propagate = False
    return state


def _restore_logging(state: tuple[list[logging.Handler], int, bool]) -> None:
    root, own = logging.getLogger(), logging.getLogger("toolkit")
    for h in state[0]:
        own.removeHandler(h)
    root.handlers[:] = state[0]
    root.setLevel(state[1])
    own.propagate = state[2]
    own.setLevel(logging.NOTSET)


def note_restart(run_dir: Path, attempt: int) -> None:
    """A `restart` event in RUN_DIR/metrics/events-rank0.jsonl (as task=train's checkpoint
    hook writes one): `status` and `runs` count the attempts of a script that logs nothing."""
    now = time.time()
    line = {"name": "restart", "start": now, "end": now, "step": 0, "rank": 0}
    line |= {"attrs": {"by": "script wrapper"}, "attempt": attempt}
    with contextlib.suppress(OSError):
        (run_dir / "metrics").mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(run_dir / "metrics" / "events-rank0.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")


def write_summary(run_dir: Path, code: int) -> None:
    """RUN_DIR/summary.json, as task=train writes it, from the steps the script logged
    (toolkit.session.log): what `toolkit status` and `runs` read. A figure the script never
    logged (its loss, tokens) is absent, not 0."""
    import math
    import statistics

    from toolkit.events import last_attempt, read_steps

    path = run_dir / "metrics" / "rank0.jsonl"
    steps = last_attempt(read_steps(path)) if path.is_file() else []

    def logged(name: str) -> list[float]:
        values = [r.get(name) for r in steps]
        return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]

    summary: dict[str, Any] = {
        "task": "script",
        "exit_code": code,
        "stop_reason": "script finished" if code == 0 else f"script exited {code}",
        "steps": int(steps[-1]["step"]) if steps else 0,
    }
    losses = logged("loss")
    if losses:
        summary["final_loss"] = losses[-1]
    for name in ("tokens_per_s", "samples_per_s"):
        rates = logged(name)
        if rates:
            summary[f"median_{name}"] = statistics.median(rates)
    with contextlib.suppress(OSError):
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def failure_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "logs" / f"script-failed-rank{rank}.json"


def note_failure(run_dir: Path, env: DistEnv, attempt: int, code: int, received: list[int]) -> None:
    """Under Slurm, record that this rank's script failed with no signal received (checked
    again after SIGNAL_GRACE_S). srun then ends the step: the other ranks get SIGTERM, which
    rank 0 must not take for a preemption. Written before this process exits, so before
    srun can signal any peer."""
    job_id = slurm_job_id(env.source)
    if job_id is None:
        return
    time.sleep(SIGNAL_GRACE_S)
    if received:
        return
    record = {"job_id": job_id, "attempt": attempt, "rank": env.rank, "code": code}
    with contextlib.suppress(OSError):
        write_private(failure_path(run_dir, env.rank), json.dumps(record) + "\n")


def failed_first(run_dir: Path, job_id: str, attempt: int) -> dict[str, int] | None:
    """The failure a rank recorded in this attempt of job `job_id` (`note_failure`), if any."""
    for path in sorted((run_dir / "logs").glob("script-failed-rank*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            if record.get("job_id") == job_id and record.get("attempt") == attempt:
                return {"rank": int(record["rank"]), "code": int(record["code"])}
    return None


def after_script(job: JobConfig, env: DistEnv, run_dir: Path, code: int, signalled: bool) -> int:
    """The rank's exit status; rank 0 requeues when the script asked (or a preemption
    signal ended it) and the job may restart."""
    asked = (run_dir / REQUEST).exists()
    if not (asked or signalled) or (code != 0 and asked):
        return code
    job_id = slurm_job_id(env.source)
    if job_id is None:
        return EXIT_PREEMPTED if asked else code  # locally: relaunch into the run dir
    if not env.is_rank0:
        return 0
    failed = None if asked else failed_first(run_dir, job_id, restart_count())
    if failed is not None:
        log.error(
            "rank %d's script exited %d before any signal: Slurm ended the step for that, "
            "not a preemption; not requeueing job %s",
            failed["rank"], failed["code"], job_id,
        )  # fmt: skip
        return code or 1
    policy = RequeuePolicy.of(job)
    refusal = policy.refusal(job_id, policy.restarts())
    if refusal is not None:
        (log.warning if not policy.requeue else log.error)("%s", refusal)
    else:
        (run_dir / REQUEST).unlink(missing_ok=True)
        done = requeue(job_id)
        log.warning(
            "script %s: job %s requeued=%s", "asked" if asked else "signalled", job_id, done
        )
        return 0
    return code or EXIT_PREEMPTED
