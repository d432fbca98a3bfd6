"""Profiler windows on demand: a loop hook that runs torch.profiler on every rank for a few
steps and writes RUN_DIR/profiles/step<first>/rank<k>.json.gz.

Windows open at configured steps (`telemetry.profile_steps`, `telemetry.profile_every`) or
when someone creates RUN_DIR/profile-now. Every rank must profile the same steps, so the
file is not read by each rank on its own: rank 0 looks for it and casts one vote, the loop
sums the votes in the step's all-reduce, and every rank opens the window after the same
step. No signal is used (NCCL and submitit own theirs). At most one window is in flight;
a request during a window is dropped (and the file removed). Each window is recorded as a
`profile` event naming the steps it covered. Outside a window the hook costs one stat()
on rank 0 per step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from toolkit.config.telemetry import TelemetryConfig
from toolkit.events import Event, Sink
from toolkit.hooks import Hook, Stop, TrainerView

if TYPE_CHECKING:
    from toolkit.events import StepRecord

log = logging.getLogger(__name__)

PROFILE_NOW = "profile-now"
PROFILES_DIR = "profiles"
PROFILE_EVENT = "profile"


def profiling_configured(cfg: TelemetryConfig) -> bool:
    return bool(cfg.profile_steps) or cfg.profile_every > 0 or cfg.profile_on_demand


def window_dir(run_dir: Path, first_step: int) -> Path:
    return run_dir / PROFILES_DIR / f"step{first_step:06d}"


class ProfileHook(Hook):
    num_votes = 1  # rank 0: RUN_DIR/profile-now exists

    def __init__(self, cfg: TelemetryConfig, run_dir: Path, sink: Sink):
        self.cfg = cfg
        self.run_dir = run_dir
        self.trigger = run_dir / PROFILE_NOW
        self.sink = sink
        self.profiler: Any = None
        self.first_step = 0  # steps are 1-based: the window covers [first_step, last_step]
        self.last_step = 0
        self.opened_at = 0.0
        self.rank = 0

    # -- when -------------------------------------------------------------------------
    def _scheduled(self, next_step: int) -> int | None:
        """The last step of a configured window that starts at next_step, or None."""
        steps = list(self.cfg.profile_steps)
        if steps and steps[0] == next_step:
            return int(steps[1])
        every = self.cfg.profile_every
        if every > 0 and next_step % every == 0:
            return next_step + self.cfg.profile_length - 1
        return None

    def on_start(self, trainer: TrainerView) -> None:
        self.rank = trainer.rank
        last = self._scheduled(trainer.step + 1)
        if last is not None:
            self._open(trainer, trainer.step + 1, last)

    def votes(self, trainer: TrainerView) -> list[float]:
        if trainer.rank != 0 or not self.cfg.profile_on_demand:
            return [0.0]
        return [1.0 if self.trigger.exists() else 0.0]

    def after_step(
        self, trainer: TrainerView, record: StepRecord, votes: list[float]
    ) -> Stop | None:
        step = trainer.step
        requested = bool(votes) and votes[0] > 0
        if requested and trainer.rank == 0:
            self.trigger.unlink(missing_ok=True)
        if self.profiler is not None:
            if step < self.last_step:
                self.profiler.step()  # the trace's ProfilerStep#<n> is the loop's step n
                return None  # one window at a time: a request now is dropped
            self._close(trainer)
        last = self._scheduled(step + 1)
        if requested:
            last = max(last or 0, step + self.cfg.profile_length)
        if last is not None:
            self._open(trainer, step + 1, last)
        return None

    def on_end(self, trainer: TrainerView) -> None:
        if self.profiler is not None:  # training ended inside the window
            self.last_step = trainer.step
            self._close(trainer)

    # -- how --------------------------------------------------------------------------
    def _open(self, trainer: TrainerView, first: int, last: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        if first > trainer.total_steps:
            return
        activities = [ProfilerActivity.CPU]
        cuda = trainer.device.type == "cuda" and torch.cuda.is_available()
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        self.first_step, self.last_step = first, min(last, trainer.total_steps)
        self.opened_at = time.time()
        if cuda and self.cfg.profile_cuda_snapshot and _snapshot_supported():
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self.profiler = profile(
            activities=activities,
            record_shapes=True,
            with_stack=self.cfg.profile_with_stack,
            profile_memory=self.cfg.profile_memory,
        )
        # ProfilerStep#<first> .. #<last> in the trace (without a schedule torch.profiler
        # marks no steps unless asked to).
        self.profiler.record_steps = True
        self.profiler.step_num = first
        self.profiler.start()
        if trainer.rank == 0:
            log.info("profiling steps %d..%d", self.first_step, self.last_step)

    def _close(self, trainer: TrainerView) -> None:
        profiler, self.profiler = self.profiler, None
        out = window_dir(self.run_dir, self.first_step)
        attrs: dict[str, Any] = {
            "first_step": self.first_step,
            "last_step": min(self.last_step, trainer.step),
        }
        try:
            profiler.stop()
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"rank{trainer.rank}.json.gz"
            profiler.export_chrome_trace(str(path))
            attrs["path"] = str(path)
            if self.cfg.profile_cuda_snapshot and trainer.device.type == "cuda":
                attrs["memory_snapshot"] = _dump_snapshot(out / f"rank{trainer.rank}-memory.pickle")
        except Exception as exc:  # noqa: BLE001 - a failed trace must not stop training
            log.warning("profiler window at step %d failed: %s", self.first_step, exc)
            attrs["error"] = f"{type(exc).__name__}: {exc}"
        self.sink.write_event(
            Event(PROFILE_EVENT, self.opened_at, time.time(), trainer.step, trainer.rank, attrs)
        )


def _snapshot_supported() -> bool:
    memory = getattr(torch.cuda, "memory", None)
    return hasattr(memory, "_record_memory_history") and hasattr(memory, "_dump_snapshot")


def _dump_snapshot(path: Path) -> str | None:
    if not _snapshot_supported():
        return None
    torch.cuda.memory._dump_snapshot(str(path))
    torch.cuda.memory._record_memory_history(enabled=None)
    return str(path)
