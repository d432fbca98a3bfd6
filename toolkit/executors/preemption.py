"""Scheduler control inside the job: preemption signals, the final checkpoint, requeue.

The signal handler only records the signal. `PreemptionHook` casts it as a vote in the
step's all-reduce (no collective of its own), so every rank stops at the same step boundary;
then the final checkpoint must commit before the job is requeued: one retry if it failed,
and a requeue without it only when an older committed checkpoint exists to resume from.

On Slurm the job gets `--signal=USR2@<lead>` before its time limit and SIGTERM when it is
preempted (or requeued). Every dataset loads in torch DataLoader worker *processes*
(toolkit.data.loader.StepLoader, or torchdata's StatefulDataLoader), which set SIG_IGN for
both; Python delivers signals to the main thread only, so no pin-memory thread is
interrupted by them.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from toolkit.distributed.env import restart_count
from toolkit.errors import EXIT_PREEMPTED, EXIT_SAVE_FAILED
from toolkit.events import Event, Sink, StepRecord
from toolkit.hooks import (
    CommitStatus,
    Hook,
    Stop,
    TrainerView,
)

if TYPE_CHECKING:
    from toolkit.executors.slurm_exclude import JobShape

log = logging.getLogger(__name__)


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
        elif signum == signal.SIGINT:  # a second Ctrl-C: stop waiting for the step boundary
            signal.default_int_handler(signum, frame)

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


# slurmd refuses a batch job whose credential is not newer, to the second, than the
# revocation of the attempt it just killed ("Job credential revoked", seen on the dev cluster
# when StartTime=now put a requeued job back on one of its nodes within the same second):
# Slurm's own ~120 s hold avoids it; a requeue that starts the job at once waits this long.
RESTART_AFTER_KILL_S = 2.0


def requeue(job_id: str, exclude: list[str] | None = None) -> bool:
    """`scontrol requeue` the job, then make it eligible now (Slurm otherwise delays a
    requeued job's start by ~120 s), with `exclude` as its ExcNodeList when given (Slurm
    takes it only while the job is pending). Returns whether the requeue itself succeeded."""
    try:
        subprocess.run(
            ["scontrol", "requeue", job_id], check=True, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.error("scontrol requeue %s failed: %s", job_id, detail)
        return False
    start_requeued(job_id, exclude, tries=5)
    return True


def start_requeued(job_id: str, exclude: list[str] | None = None, tries: int = 6) -> bool:
    """Make a job Slurm just requeued (by us, or after its attempt ended) eligible now, with
    `exclude` as its ExcNodeList, no sooner than RESTART_AFTER_KILL_S after the kill."""
    time.sleep(RESTART_AFTER_KILL_S)
    return update_pending(job_id, exclude, start_now=True, tries=tries)


def update_pending(
    job_id: str, exclude: list[str] | None = None, start_now: bool = True, tries: int = 6
) -> bool:
    """`scontrol update JobId=… [ExcNodeList=…] [StartTime=now]` on the pending job, retried
    (a requeued job is completing for a moment). Whether it took."""
    args = ["scontrol", "update", f"JobId={job_id}"]
    if exclude:
        args.append(f"ExcNodeList={','.join(exclude)}")
    if start_now:
        args.append("StartTime=now")
    done = None
    for attempt in range(tries):
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("%s failed: %s", " ".join(args), exc)
            return False
        if done.returncode == 0:
            return True
        if attempt + 1 < tries:
            time.sleep(1.0 + attempt)
    log.warning("%s failed: %s", " ".join(args), done.stderr.strip() if done else "")
    return False


def slurm_job_id(env_source: str) -> str | None:
    """The job to requeue: SLURM_JOB_ID when the ranks were started by Slurm (srun), not
    when a local job merely runs inside an allocation."""
    return (os.environ.get("SLURM_JOB_ID") or None) if env_source == "slurm" else None


class Saver(Protocol):
    """What preemption needs of checkpointing (toolkit.checkpoint.hook.CheckpointHook)."""

    def commit_now(self, trainer: TrainerView, retry: bool = False) -> CommitStatus:
        """Save this step and wait for its commit (every rank calls it)."""
        ...


@dataclass(frozen=True)
class RequeuePolicy:
    signal_name: str = "USR2"  # cluster.signal: sent signal_lead_s before the time limit
    signal_lead_s: float = 120.0
    requeue: bool = True  # checkpoint.requeue
    max_restarts: int = 10  # checkpoint.max_restarts
    slurm_job_id: str | None = None  # None: not started by Slurm, nothing to requeue
    # Where bad-node evidence and excluded_nodes.json live, and what the exclusion decision
    # needs of the job (toolkit.executors.slurm_exclude); None: requeue without exclusion.
    run_dir: Path | None = None
    shape: JobShape | None = None


class PreemptionHook(Hook):
    """A signal on any rank stops every rank at the next step boundary; the final checkpoint
    commits (one retry), then rank 0 requeues the Slurm job if there is a checkpoint to
    resume from. Locally the job exits EXIT_PREEMPTED: relaunch into the run dir to resume."""

    def __init__(self, saver: Saver, sink: Sink, policy: RequeuePolicy):
        self.saver = saver
        self.sink = sink
        self.policy = policy
        # Ctrl-C (SIGINT to the terminal's process group) stops like a preemption too.
        self.signals = sorted(
            {signal_number(policy.signal_name), int(signal.SIGTERM), int(signal.SIGINT)}
        )
        self.num_votes = len(self.signals)
        self.flag: SignalFlag | None = None
        self._received: str | None = None
        self.exclusion: Any = None  # the exclusion decision of this hook's requeue, if any

    def on_start(self, trainer: TrainerView) -> None:
        self.flag = SignalFlag(self.signals)
        if trainer.rank == 0:
            names = ", ".join(signal.Signals(s).name for s in self.signals)
            log.info("preemption signals armed: %s", names)

    def votes(self, trainer: TrainerView) -> list[float]:
        got = self.flag.signum if self.flag is not None else None
        return [float(got == s) for s in self.signals]

    def after_step(
        self, trainer: TrainerView, record: StepRecord, votes: list[float]
    ) -> Stop | None:
        received = [s for s, v in zip(self.signals, votes, strict=True) if v > 0]
        if not received:
            return None
        self._received = signal.Signals(received[0]).name
        return Stop(f"signal ({self._received})", save=True)

    def on_stop(self, trainer: TrainerView, stop: Stop) -> Stop | None:
        if self._received is None:
            return None
        t0 = time.time()
        status = self.saver.commit_now(trainer)
        retried = not status.step_committed
        if retried:
            log.warning("preemption checkpoint of step %d failed; retrying once", trainer.step)
            status = self.saver.commit_now(trainer, retry=True)
        reason, requeued, why = self._requeue(trainer, status)
        attrs: dict[str, Any] = {
            "signal": self._received,
            "reason": reason,
            "slurm_job_id": self.policy.slurm_job_id,
            "save_committed": status.step_committed,
            "save_retried": retried,
            "resume_step": status.latest_step,
            "requeued": requeued,
            "requeue_decision": why,
            "restart_count": restart_count(),
        }
        if self.exclusion is not None:
            attrs["excluded_nodes"] = self.exclusion.exclude
            attrs["exclusion"] = self.exclusion.message
        self.sink.write_event(
            Event("preemption", t0, time.time(), trainer.step, trainer.rank, attrs)
        )
        if self.policy.slurm_job_id is None:
            code = EXIT_PREEMPTED if status.latest_step is not None else EXIT_SAVE_FAILED
            if trainer.rank == 0:
                log.warning(
                    "received %s: %s; exiting with code %d. Relaunch with the same "
                    "hydra.run.dir to resume.",
                    self._received,
                    why,
                    code,
                )
        else:
            code = 0 if status.latest_step is not None else EXIT_SAVE_FAILED
        return Stop(f"{reason} ({self._received})", exit_code=code, save=False)

    def _requeue(self, trainer: TrainerView, status: CommitStatus) -> tuple[str, bool, str]:
        """(reason, requeued, the decision in words); rank 0 decides and acts."""
        step = trainer.step
        if status.step_committed:
            saved = f"checkpointed step {step}"
        elif status.latest_step is not None:
            saved = (
                f"the checkpoint of step {step} failed twice; the newest committed one is "
                f"step {status.latest_step}"
            )
        else:
            saved = f"the checkpoint of step {step} failed twice and none is committed"
        job_id = self.policy.slurm_job_id
        if job_id is None:
            return "signal", False, saved
        if trainer.rank != 0:
            return "slurm", False, saved
        reason = classify(job_end_time(job_id), time.time(), self.policy.signal_lead_s)
        restarts = restart_count()
        if not self.policy.requeue:
            why = f"{saved}; checkpoint.requeue=false: not requeueing job {job_id}"
        elif restarts >= self.policy.max_restarts:
            why = (
                f"{saved}; job {job_id} restarted {restarts} times "
                f"(checkpoint.max_restarts={self.policy.max_restarts}): not requeueing"
            )
        elif status.latest_step is None:
            why = f"{saved}: not requeueing job {job_id}, it would start from scratch"
        else:
            requeued, excluding = self._requeue_excluding(job_id, restarts)
            why = f"{saved}; job {job_id} requeued={requeued}{excluding}"
            if requeued:
                log.warning("%s (%s) at step %d: %s", reason, self._received, step, why)
                return reason, requeued, why
        log.error("%s (%s) at step %d: %s", reason, self._received, step, why)
        return reason, False, why

    def _requeue_excluding(self, job_id: str, attempt: int) -> tuple[bool, str]:
        """Requeue, leaving out the nodes found bad in this attempt (a straggler marked for
        exclusion, ...). (requeued, '; <the exclusion decision>' or '')."""
        if self.policy.run_dir is None or self.policy.shape is None:
            return requeue(job_id), ""
        from toolkit.executors.slurm_exclude import requeue_with_exclusion

        requeued, decision = requeue_with_exclusion(
            self.policy.run_dir, job_id, attempt, self.policy.shape
        )
        self.exclusion = decision
        said = "" if decision.message == "no bad node to exclude" else f"; {decision.message}"
        return requeued, said

    def on_end(self, trainer: TrainerView) -> None:
        if self.flag is not None:
            self.flag.close()
