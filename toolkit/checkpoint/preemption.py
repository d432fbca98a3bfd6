"""Signals and Slurm requeue. The handler only records the signal; the hook acts on it at
the next step boundary, after all ranks agree (all_reduce MAX of the flag).

On Slurm the job gets `--signal=USR2@<lead>` before its time limit and SIGTERM when it is
preempted (or requeued). Data loading runs in a thread (toolkit.train.data.Loader), and
Python delivers signals to the main thread only, so no loader worker can be interrupted by
them; a worker *process* added later must set SIG_IGN for these signals.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from datetime import datetime
from types import FrameType

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpointed after a signal; relaunch to resume
EXIT_SAVE_FAILED = 74  # EX_IOERR: stopped because a checkpoint could not be written


class SignalFlag:
    """Records the first of `signals` received; restores the previous handlers on close()."""

    def __init__(self, signals: list[int]):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: preemption signals are not handled")
            return
        for s in signals:
            self._previous[s] = signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "none"

    def close(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous.clear()


def signal_number(name: str) -> int:
    """'USR2', 'SIGUSR2' or '12' -> the signal number (ValueError names the input)."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    try:
        return int(signal.Signals[text if text.startswith("SIG") else "SIG" + text])
    except KeyError:
        raise ValueError(f"cluster.signal={name}: unknown signal name") from None


def parse_slurm_time(text: str) -> float | None:
    """Slurm's 'YYYY-MM-DDTHH:MM:SS' (local time) -> unix time; None for Unknown/N/A."""
    text = text.strip()
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def job_end_time(job_id: str) -> float | None:
    """The job's scheduled end (unix), from squeue, else scontrol show job; None if unknown."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%e"], capture_output=True, text=True, timeout=15
        ).stdout
        end = parse_slurm_time(out.splitlines()[0]) if out.strip() else None
        if end is not None:
            return end
        out = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=15
        ).stdout
        for field in out.split():
            if field.startswith("EndTime="):
                return parse_slurm_time(field.partition("=")[2])
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not read the end time of job %s: %s", job_id, exc)
    return None


def classify(end_unix: float | None, now_unix: float, lead_s: float, slack_s: float = 60.0) -> str:
    """'timeout' when the job's end is within the signal lead time (+ slack), else
    'preemption' (the scheduler took the allocation early). Unknown end: 'preemption'."""
    if end_unix is not None and end_unix - now_unix <= lead_s + slack_s:
        return "timeout"
    return "preemption"


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def requeue(job_id: str) -> bool:
    """`scontrol requeue` the job, then make it eligible now (Slurm otherwise delays a
    requeued job's start by ~120 s). Returns whether the requeue itself succeeded."""
    try:
        subprocess.run(
            ["scontrol", "requeue", job_id], check=True, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.error("scontrol requeue %s failed: %s", job_id, detail)
        return False
    for attempt in range(5):
        done = subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode == 0:
            break
        time.sleep(1.0 + attempt)  # the job may still be completing
    else:
        log.warning(
            "scontrol update JobId=%s StartTime=now failed: %s", job_id, done.stderr.strip()
        )
    return True
