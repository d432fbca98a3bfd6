"""The opt-in API for your own script (`from toolkit import session`): step records, a
step-resolution heartbeat, preemption as a clean stop, a checkpoint dir and a requeue.

Inside `toolkit launch script=...` the rank wrapper (toolkit.tasks.script) hands this
module one typed spec in the environment (TOOLKIT_SESSION, JSON). Outside a toolkit launch
there is none and every function is a no-op, so the script still runs alone with plain
`python train.py` or torchrun. Nothing here blocks the script or raises into it: records go
to the node agent through a non-blocking socket (toolkit.telemetry.transport).

    for step in range(start, steps):
        with session.step(step + 1):          # feeds the hang watchdog
            loss = train_one_step()
        session.log(step + 1, loss=loss)      # metrics/rank<k>.jsonl and the node's HDF5
        if session.should_stop():             # collective: every rank, same step
            save(session.checkpoint_dir())
            session.requeue()
            break
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import mmap
import os
import signal
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_logger = logging.getLogger(__name__)

ENV = "TOOLKIT_SESSION"
BEAT = struct.Struct("<qq")  # beats so far, the step of the last one
REQUEST = "requeue-request.json"  # in RUN_DIR: the script asked to be requeued


@dataclass
class SessionSpec:
    """What the rank wrapper tells the script (one JSON value in TOOLKIT_SESSION)."""

    run_dir: str
    rank: int
    attempt: int  # the job attempt (Slurm restart count)
    checkpoint_dir: str
    beat_path: str  # the step heartbeat the wrapper reads (BEAT)
    socket: str | None = None  # the node agent's socket; None: telemetry off
    stop_signals: list[int] = field(default_factory=list)

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, text: str) -> SessionSpec:
        return cls(**json.loads(text))


class _Session:
    def __init__(self, spec: SessionSpec):
        self.spec = spec
        self.stop_signum: int | None = None
        self.last_log = time.time()
        self.beats = 0
        self.step = 0  # the last step logged
        self.warned: set[str] = set()  # names log() warned about (once each)
        fd = os.open(spec.beat_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, BEAT.size)
            self.beat_map = mmap.mmap(fd, BEAT.size)
        finally:
            os.close(fd)
        metrics = Path(spec.run_dir) / "metrics"
        metrics.mkdir(parents=True, exist_ok=True)
        from toolkit.events import next_attempt

        path = metrics / f"rank{spec.rank}.jsonl"
        self.attempt = next_attempt([path], spec.attempt)  # a local resume counts as well
        self.steps = open(path, "a", buffering=1)  # noqa: SIM115
        self.sender = None
        if spec.socket:
            from toolkit.telemetry.transport import Sender

            self.sender = Sender(spec.socket, 1024)
        for signum in spec.stop_signals:
            signal.signal(signum, self._on_signal)
        self.trackers = None
        if spec.rank == 0:
            try:
                self.trackers = self._trackers()
            except Exception:  # noqa: BLE001 - a tracker must never stop the script
                _logger.exception("toolkit.session: no experiment trackers for this script")

    def _trackers(self) -> Any:
        """The job's experiment trackers (tracking=...), on rank 0: the records log() writes
        reach them as a toolkit run's do; closed (with their timeout) when the script exits."""
        from toolkit.config.compose import job_to_dict, load_job
        from toolkit.events import Fanout
        from toolkit.tracking import build_tracking_sinks

        run_dir = Path(self.spec.run_dir)
        job = load_job(run_dir / "config.yaml")
        from toolkit.config.script import described  # the script, not the default model

        sinks = build_tracking_sinks(job.tracking, True, run_dir, described(job_to_dict(job)))
        if not sinks:
            return None
        trackers = Fanout(sinks)
        atexit.register(trackers.close)
        return trackers

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signum = signum  # only a flag: the stop happens at a step boundary

    def beat(self, step: int) -> None:
        self.beats += 1
        BEAT.pack_into(self.beat_map, 0, self.beats, step)


_session: _Session | None = None


def _current() -> _Session | None:
    global _session
    if _session is None and os.environ.get(ENV):
        try:
            _session = _Session(SessionSpec.from_env(os.environ[ENV]))
        except Exception:  # noqa: BLE001 - the script runs on without the toolkit's extras
            _logger.exception("toolkit.session: cannot start; continuing without it")
            os.environ.pop(ENV, None)
    return _session


def active() -> bool:
    """True inside a toolkit launch."""
    return _current() is not None


def heartbeat(step: int = 0) -> None:
    """The script made progress (at step `step`): the hang watchdog then watches at step
    resolution (fault.hang_timeout_s between heartbeats) instead of output and CPU time."""
    s = _current()
    if s is not None:
        s.beat(step)


@contextlib.contextmanager
def step(number: int) -> Iterator[None]:
    """One training step: a heartbeat as it starts and as it ends."""
    heartbeat(number)
    try:
        yield
    finally:
        heartbeat(number)


def log(step: int, **metrics: float) -> None:
    """A step record (toolkit.events.StepRecord's fields: loss, step_time_s, tokens,
    tokens_per_s, lr, grad_norm, ...; other names are kept in the JSON line) into
    RUN_DIR/metrics/rank<k>.jsonl and the node's HDF5 file. step_time_s defaults to the time
    since the previous log()."""
    s = _current()
    if s is None:
        return
    try:
        step = int(step)
    except (TypeError, ValueError, OverflowError):
        _warn_once(
            s, "step", f"log(step={step!r}): not a whole number; recorded as step {s.step + 1}"
        )
        step = s.step + 1
    s.step = step
    from toolkit.events import STEP_FIELDS, StepRecord, step_line

    now = time.time()
    metrics = numbers(s, step, metrics)
    known = STEP_FIELDS
    base: dict[str, Any] = dict.fromkeys(
        ("data_wait_s", "forward_backward_s", "optimizer_s", "grad_norm", "lr", "mfu"), 0.0
    )
    base |= {"loss": float("nan"), "tokens": 0, "tokens_per_s": 0.0, "mem_peak_bytes": 0}
    base |= {"step_time_s": now - s.last_log}
    given = {k: v for k, v in metrics.items() if k in known}
    elapsed = float(given.get("step_time_s", base["step_time_s"]))
    if "tokens" in given and "tokens_per_s" not in given and elapsed > 0:
        given["tokens_per_s"] = float(given["tokens"]) / elapsed
    given |= {k: int(given[k]) for k in ("tokens", "mem_peak_bytes") if k in given}
    fixed = {"step": step, "wall_time": now, "rank": s.spec.rank, "attempt": s.attempt}
    series = {k: v for k, v in metrics.items() if k not in known}  # your own: train/<name>
    record = StepRecord(**{**base, **given, **fixed}, metrics=series)
    # What the script did not log is absent from its line, not 0.0 (and NaN, "not logged",
    # for the node's HDF5 file and its trackers).
    kept = given.keys() | fixed.keys() | {"step_time_s"}
    line = {k: v for k, v in step_line(record).items() if k in kept or k not in known}
    unlogged = {
        k: math.nan for k, v in vars(record).items() if k in known - kept and isinstance(v, float)
    }
    sent = dataclasses.replace(record, **unlogged)  # to the node's file and the trackers
    s.last_log = now
    s.beat(step)
    try:
        s.steps.write(json.dumps(line, default=float) + "\n")
        if s.sender is not None:
            s.sender.send({"kind": "step", **dataclasses.asdict(sent)})
        if s.trackers is not None:
            s.trackers.write_step(sent)
    except Exception:  # noqa: BLE001 - a metrics failure must not stop training
        _logger.exception("toolkit.session: could not write the record of step %d", step)


def numbers(s: _Session, step: int, metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics as floats (Python and NumPy numbers, one-element tensors); any other
    value is left out of the record with one warning per name, and the rest is kept."""
    out = {}
    for name, value in metrics.items():
        try:
            if isinstance(value, str | bytes):
                raise TypeError("text")
            out[name] = float(value)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            _warn_once(
                s,
                name,
                f"log(step={step}, {name}={_short(value)}): not a number; {name} is left out of "
                f"this and later records where it is not one (the rest of each record is kept)",
            )
    return out


def _warn_once(s: _Session, name: str, message: str) -> None:
    if name not in s.warned:
        s.warned.add(name)
        _logger.warning("toolkit.session: %s", message)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def should_stop() -> bool:
    """True once a preemption signal (cluster.signal, SIGTERM) reached any rank. With a
    process group it is a collective (an all_reduce): call it on every rank at the same
    step, and they all stop at the same boundary. False outside a toolkit launch."""
    s = _current()
    if s is None:
        return False
    got = s.stop_signum is not None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        import torch

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1.0 if got else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        got = bool(flag.item() > 0)
    return got


def checkpoint_dir(default: str | os.PathLike[str] | None = None) -> Path | None:
    """Where to save and, in the next attempt, to find the checkpoint: RUN_DIR/checkpoints
    (created); `default` (or None) outside a toolkit launch."""
    s = _current()
    if s is None:
        return None if default is None else Path(default)
    path = Path(s.spec.checkpoint_dir)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def attempt() -> int:
    """The job attempt: 0, then 1 after the first requeue, ..."""
    s = _current()
    return 0 if s is None else s.spec.attempt


def requeue() -> None:
    """Ask to be requeued once this script exits (call it after saving, then exit 0). On
    Slurm the toolkit requeues the job under checkpoint.requeue and checkpoint.max_restarts;
    locally the launch exits 75: relaunch into the same run dir to resume."""
    s = _current()
    if s is None:
        return
    path = Path(s.spec.run_dir) / REQUEST
    with contextlib.suppress(OSError):
        path.write_text(json.dumps({"rank": s.spec.rank, "attempt": s.spec.attempt}) + "\n")
