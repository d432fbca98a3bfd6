"""The training loop's hook contract: what a hook sees of the trainer, what it may answer.

Checkpointing, scheduler control (preemption, requeue) and benchmark probes attach to the
loop as hooks. They see the trainer through `TrainerView` (its model, optimizer, device,
place in the job and its state as a dict), never its internals, and they stop it only by
returning a typed `Stop`. This module sits below the loop and the hooks alike, so that
neither imports the other.

Every method is called on every rank at the same point of the same step, so a hook may run
collectives in any of them. Agreement costs no collective of its own: each hook casts
`votes()` (floats) before the step's loss all-reduce, the loop sums them over ranks in that
same all-reduce, and `after_step` receives the sums.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from toolkit.errors import EXIT_OK

if TYPE_CHECKING:
    import torch
    from torch import nn

    from toolkit.events import StepRecord


@dataclass(frozen=True)
class Stop:
    """Why training stops after this step; every rank returns the same one."""

    reason: str  # e.g. "completed", "time budget reached", "preemption (USR2)"
    exit_code: int = EXIT_OK
    save: bool = True  # checkpoint the final state before the process ends (when enabled)


@dataclass(frozen=True)
class CommitStatus:
    """After a blocking save, the same on every rank: did this step's checkpoint commit,
    and which is the newest committed one (this step's or an older one)."""

    step_committed: bool
    latest_step: int | None


class TrainerView(Protocol):
    """What a hook may use of the trainer."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    rank: int
    world_size: int

    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        ...

    @property
    def total_steps(self) -> int: ...

    def state_dict(self) -> dict[str, Any]:
        """Everything but model and optimizer that an exact resume needs (JSON-able)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Hook:
    """A hook with nothing to do; subclasses override what they need."""

    num_votes = 0  # floats this hook adds to the step's all-reduce

    def on_start(self, trainer: TrainerView) -> None:
        """Before the first step (resume happens here)."""

    def before_optimizer_step(self, trainer: TrainerView) -> None:
        """After forward/backward and clipping, right before parameters and optimizer state
        change (e.g. to wait for a checkpoint's copy of them)."""

    def votes(self, trainer: TrainerView) -> list[float]:
        """This rank's `num_votes` values, summed over ranks with the step's loss."""
        return []

    def step_metrics(self, trainer: TrainerView, batch: list[Any]) -> dict[str, float]:
        """Your own series at this step (name -> number), before its record is written:
        they join it in metrics/rank<k>.jsonl, the report (a plot per series) and your
        trackers (train/<name>). `trainer.step` is this step's number, `batch` this rank's
        micro-batches of the step (as the loader gave them), `trainer.model`
        the model after the step's update. Each rank reports its own values: all-reduce
        for a global one (every rank calls this at the same point)."""
        return {}

    def after_step(
        self, trainer: TrainerView, record: StepRecord, votes: list[float]
    ) -> Stop | None:
        """`votes`: the sums over ranks of every rank's votes(). Return a Stop to end
        training after this step (it must be the same on every rank)."""
        return None

    def eval_metrics(self, trainer: TrainerView) -> dict[str, float]:
        """At each evaluation, after the validation loss: metrics of this hook's own (name ->
        value, the same on every rank), added to the eval event and summary.json."""
        return {}

    def restore_finite(self, trainer: TrainerView) -> str | None:
        """A step went non-finite and trainer.on_nonfinite=rollback: put the trainer back to
        the newest committed checkpoint this hook keeps (model, optimizer, schedule, data
        position, RNG) and return its path; None where this hook keeps none. Every rank calls
        it; the first hook to restore wins."""
        return None

    def on_stop(self, trainer: TrainerView, stop: Stop) -> Stop | None:
        """Training stops (for any reason, hooks in order); may return an amended Stop
        (e.g. another exit status when the final save failed)."""
        return None

    def on_end(self, trainer: TrainerView) -> None:
        """Always, last, also after an error (release resources, wait for workers)."""


_warned: set[str] = set()  # series step_metrics left out, said once each


def step_metrics(hooks: list[Hook], trainer: TrainerView, batch: list[Any]) -> dict[str, float]:
    """Every hook's step_metrics, as floats (a one-element tensor too); a value that is no
    number is left out of the record, with one warning per hook and name (as session.log)."""
    out: dict[str, float] = {}
    for hook in hooks:
        for name, value in hook.step_metrics(trainer, batch).items():
            try:
                out[str(name)] = float(value)
            except (TypeError, ValueError, RuntimeError):
                key = f"{type(hook).__name__}.{name}"
                if key not in _warned:
                    _warned.add(key)
                    logging.getLogger(__name__).warning(
                        "%s.step_metrics: %s=%.60r is not a number (return floats or "
                        "one-element tensors); left out of this and later records where it "
                        "is not one",
                        type(hook).__name__,
                        name,
                        value,
                    )
    return out


def split_votes(hooks: list[Hook], sums: list[float]) -> list[list[float]]:
    """The summed votes cut back into each hook's share, in hook order."""
    shares, at = [], 0
    for hook in hooks:
        shares.append(sums[at : at + hook.num_votes])
        at += hook.num_votes
    return shares
