"""The live straggler score: a rank slower than the others, window after window, while the job
runs (the report finds the same ranks afterwards, with the same score).

Every rank casts its last step's `compute_s` as a vote at its own index (world_size floats in
the step's loss all-reduce, no collective of its own), so every rank sees every rank's
compute time of every step. Per window of `fault.straggler_window_steps` steps, each rank's
score is the report's (`toolkit.telemetry.report.analysis`): the median over the window's
steps of its value over the per-step median of all ranks, minus one. A rank above
`fault.straggler_margin` for `fault.straggler_windows` consecutive windows is a straggler:
rank 0 writes a `straggler` event and a log line naming the rank, its node and the metric,
and with `fault.straggler_action=exclude_on_requeue` calls `on_straggler` (the task marks the
node for exclusion at the next requeue). It never stops a job itself.

`compute_s` is compute without the exposed communication (telemetry.comm_timing): the fast
ranks' wait for a slow one lands in communication, not in their compute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from toolkit.config.fault import FaultConfig
from toolkit.events import Event, Sink, StepRecord
from toolkit.hooks import Hook, Stop, TrainerView
from toolkit.telemetry.report.analysis import _ratio_scores

log = logging.getLogger(__name__)

METRIC = "compute_s"
STRAGGLER = "straggler"


def window_scores(window: np.ndarray) -> np.ndarray:
    """Per rank (rows) of a window (ranks x steps): the report's straggler score."""
    _, score, _ = _ratio_scores(window)
    return score


class StragglerHook(Hook):
    def __init__(
        self,
        fault: FaultConfig,
        sink: Sink,
        world_size: int,
        hosts_by_rank: Callable[[], list[str]],
        on_straggler: Callable[[str, str], None] | None = None,
    ):
        """hosts_by_rank: called once in on_start, on every rank (may be a collective).
        on_straggler(node, reason): rank 0 calls it for a straggler when the action is
        exclude_on_requeue."""
        self.fault = fault
        self.sink = sink
        self.num_votes = world_size
        self._hosts_by_rank = hosts_by_rank
        self.on_straggler = on_straggler
        self.hosts: list[str] = []
        self._last = 0.0
        self._rows: list[list[float]] = []
        self.above = [0] * world_size  # consecutive windows above the margin, per rank
        self.flagged: set[int] = set()
        self.scores: list[float] = []  # the last window's scores

    def on_start(self, trainer: TrainerView) -> None:
        self.hosts = self._hosts_by_rank()

    def votes(self, trainer: TrainerView) -> list[float]:
        v = [0.0] * self.num_votes
        v[trainer.rank] = self._last
        return v

    def after_step(
        self, trainer: TrainerView, record: StepRecord, votes: list[float]
    ) -> Stop | None:
        previous, self._last = votes, float(getattr(record, METRIC))
        if not any(previous):  # the first step of the attempt: nothing cast yet
            return None
        self._rows.append(previous)
        if len(self._rows) >= self.fault.straggler_window_steps:
            self._close_window(trainer)
        return None

    def _close_window(self, trainer: TrainerView) -> None:
        window = np.asarray(self._rows, dtype=float).T  # ranks x steps
        self._rows = []
        self.scores = [float(s) for s in window_scores(window)]
        for r, score in enumerate(self.scores):
            self.above[r] = self.above[r] + 1 if score > self.fault.straggler_margin else 0
            if self.above[r] >= self.fault.straggler_windows and r not in self.flagged:
                self.flagged.add(r)
                if trainer.rank == 0:
                    self._report(trainer, r, score)

    def _report(self, trainer: TrainerView, rank: int, score: float) -> None:
        node = self.hosts[rank] if rank < len(self.hosts) else "?"
        windows, steps = self.fault.straggler_windows, self.fault.straggler_window_steps
        action = self.fault.straggler_action
        what = (
            f"straggler: rank {rank} on node {node} is {100 * score:.0f}% slower in {METRIC} "
            f"than the median rank for {windows} consecutive windows of {steps} steps"
        )
        if action == "exclude_on_requeue":
            what += "; its node is left out at the next requeue"
        log.warning("%s (step %d)", what, trainer.step)
        now = time.time()
        attrs = {
            "straggler_rank": rank,
            "node": node,
            "metric": METRIC,
            "score": score,
            "margin": self.fault.straggler_margin,
            "windows": windows,
            "window_steps": steps,
            "action": action,
        }
        self.sink.write_event(Event(STRAGGLER, now, now, trainer.step, trainer.rank, attrs))
        if action == "exclude_on_requeue" and self.on_straggler is not None:
            self.on_straggler(node, f"straggler: {100 * score:.0f}% slower in {METRIC}")
