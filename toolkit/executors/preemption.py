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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from toolkit import slurm_cli
from toolkit.errors import EXIT_PREEMPTED, EXIT_SAVE_FAILED
from toolkit.events import Event, Sink, StepRecord
from toolkit.executors.requeue import RequeuePolicy
from toolkit.executors.slurm_exclude import requeue_with_exclusion
from toolkit.hooks import CommitStatus, Hook, Stop, TrainerView

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


def classify(end_unix: float | None, now_unix: float, lead_s: float, slack_s: float = 60.0) -> str:
    """'timeout' when the job's end is within the signal lead time (+ slack), else
    'preemption' (the scheduler took the allocation early). Unknown end: 'preemption'."""
    if end_unix is not None and end_unix - now_unix <= lead_s + slack_s:
        return "timeout"
    return "preemption"


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
class PreemptionSettings:
    """What the hook needs besides the requeue policy."""

    signal_name: str = "USR2"  # cluster.signal: sent signal_lead_s before the time limit
    signal_lead_s: float = 120.0
    slurm_job_id: str | None = None  # None: not started by Slurm, nothing to requeue
    # Where bad-node evidence and excluded_nodes.json live (toolkit.executors.slurm_exclude);
    # None: requeue without exclusion.
    run_dir: Path | None = None


class PreemptionHook(Hook):
    """A signal on any rank stops every rank at the next step boundary; the final checkpoint
    commits (one retry), then rank 0 requeues the Slurm job if there is a checkpoint to
    resume from. Locally the job exits EXIT_PREEMPTED: relaunch into the run dir to resume."""

    def __init__(
        self, saver: Saver, sink: Sink, policy: RequeuePolicy, settings: PreemptionSettings
    ):
        self.saver = saver
        self.sink = sink
        self.policy = policy
        self.settings = settings
        # Ctrl-C (SIGINT to the terminal's process group) stops like a preemption too.
        self.signals = sorted(
            {signal_number(settings.signal_name), int(signal.SIGTERM), int(signal.SIGINT)}
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
            "slurm_job_id": self.settings.slurm_job_id,
            "save_committed": status.step_committed,
            "save_retried": retried,
            "resume_step": status.latest_step,
            "requeued": requeued,
            "requeue_decision": why,
            "restart_count": self.policy.restarts(),
        }
        if self.exclusion is not None:
            attrs["excluded_nodes"] = self.exclusion.exclude
            attrs["exclusion"] = self.exclusion.message
        self.sink.write_event(
            Event("preemption", t0, time.time(), trainer.step, trainer.rank, attrs)
        )
        if self.settings.slurm_job_id is None:
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
        job_id = self.settings.slurm_job_id
        if job_id is None:
            return "signal", False, saved
        if trainer.rank != 0:
            return "slurm", False, saved
        reason = classify(slurm_cli.end_time(job_id), time.time(), self.settings.signal_lead_s)
        restarts = self.policy.restarts()
        refusal = self.policy.refusal(job_id, restarts)
        if refusal is not None:
            why = f"{saved}; {refusal}"
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
        if self.settings.run_dir is None:
            return slurm_cli.requeue(job_id), ""
        requeued, decision = requeue_with_exclusion(
            self.settings.run_dir, job_id, attempt, self.policy.shape
        )
        self.exclusion = decision
        said = "" if decision.message == "no bad node to exclude" else f"; {decision.message}"
        return requeued, said

    def on_end(self, trainer: TrainerView) -> None:
        if self.flag is not None:
            self.flag.close()
