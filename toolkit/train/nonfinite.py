"""What the loop does after a step whose loss or grad norm was NaN/inf (trainer.on_nonfinite).

The step's own all-reduce already told every rank (toolkit.train.loop.Trainer.train_step),
and the step was not applied to the weights. Then:

    stop      the run ends there: exit 80, one line naming the step; no hook sees the step,
              so nothing is saved from it.
    skip      the weights stay as they were; the run goes on with the next batch.
    rollback  every rank restores the newest committed checkpoint (step s) through the
              checkpoint hook's resume path (model, optimizer, RNG; toolkit.hooks
              Hook.restore_finite), then moves on to the bad step b: the step counter,
              the schedule and the data position are those after step b, so the next step
              trains on the batch after the bad one, and the batches of steps s+1..b are not
              trained on again. Those b - s steps count as taken (the run still ends at
              trainer.steps) and their updates are discarded. A `rollback` event names
              both steps. Past trainer.max_rollbacks in one attempt, or with no committed
              checkpoint, the run stops as with stop.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import torch
import torch.distributed as dist

from toolkit.config.trainer import TrainerConfig
from toolkit.errors import EXIT_NONFINITE
from toolkit.events import Event, Sink
from toolkit.hooks import Hook, Stop, TrainerView
from toolkit.train.models.spec import Batch

log = logging.getLogger(__name__)


class Counters(Protocol):
    step: int
    tokens_seen: int


class GuardedTrainer(TrainerView, Protocol):
    """What the guard uses of toolkit.train.loop.Trainer."""

    hooks: list[Hook]
    sink: Sink
    state: Counters
    tokens_per_step: int
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Any  # toolkit.data.loader.Loader: load_state_dict({"next_step": n})


class NonfiniteGuard:
    """One rank's answer to non-finite steps; every rank reaches the same one."""

    def __init__(self, cfg: TrainerConfig):
        self.cfg = cfg
        self.num_rollbacks = 0

    def after_step(
        self,
        trainer: GuardedTrainer,
        loss: float,
        grad_norm: float,
        batches: list[Batch] | None = None,
    ) -> Stop | None:
        """The step just counted (trainer.step) was non-finite and not applied: None to go
        on, else the Stop that ends the run there. `batches`, the step's micro-batches, are
        searched for NaN/inf only here, on this rare path: when they hold any, the data is
        named as the cause instead of the learning rate."""
        bad_step = trainer.step
        what = f"non-finite loss ({loss:.4g}) or grad norm ({grad_norm:.4g}) at step {bad_step}"
        cause = data_cause(trainer, batches)
        if cause:
            what += f"; {cause}: the data is the cause, not the learning rate"
        action = self.cfg.on_nonfinite
        if action == "skip":
            log.warning("%s: step skipped, weights unchanged (trainer.on_nonfinite=skip)", what)
            return None
        if action != "rollback":
            advice = DATA_ADVICE if cause else "lower optim.lr or optim.grad_clip"
            return stop(what, f"{advice}, or set trainer.on_nonfinite=skip")
        if self.num_rollbacks >= self.cfg.max_rollbacks:
            return stop(
                f"{what}, after {self.num_rollbacks} "
                f"rollback{'' if self.num_rollbacks == 1 else 's'} (trainer.max_rollbacks="
                f"{self.cfg.max_rollbacks})",
                "lower optim.lr or optim.grad_clip, or raise trainer.max_rollbacks",
            )
        t0 = time.time()
        path = next(
            (p for h in trainer.hooks if (p := h.restore_finite(trainer)) is not None), None
        )
        if path is None:
            return stop(
                f"{what}, and no committed checkpoint to roll back to",
                "set checkpoint.enabled=true with checkpoint.interval_steps, or lower optim.lr",
            )
        self.num_rollbacks += 1
        restored_step = trainer.step
        skip_to(trainer, bad_step)
        log.warning(
            "%s: rolled back to the checkpoint of step %d (%s); going on after step %d's "
            "batch (rollback %d of trainer.max_rollbacks=%d)",
            what,
            restored_step,
            path,
            bad_step,
            self.num_rollbacks,
            self.cfg.max_rollbacks,
        )
        attrs = {
            "bad_step": bad_step,
            "restored_step": restored_step,
            "checkpoint": path,
            "skipped_steps": bad_step - restored_step,
            "rollbacks": self.num_rollbacks,
            "max_rollbacks": self.cfg.max_rollbacks,
        }
        trainer.sink.write_event(Event("rollback", t0, time.time(), bad_step, trainer.rank, attrs))
        return None


DATA_ADVICE = (
    "fix the data (`python -m toolkit.data inspect DATASET` counts NaN/inf values; a "
    "Dataset of yours: check its items)"
)


def data_cause(trainer: GuardedTrainer, batches: list[Batch] | None) -> str:
    """Which ranks' batches of this step hold NaN/inf, and where in the first such rank's
    ("" when none do). Every rank says the same: one all-reduce of three numbers per rank
    (count, micro-batch, tensor), on this rare path only; the tensor's place is named from
    this rank's batch, which has the same structure on every rank."""
    found = torch.zeros(trainer.world_size, 3, dtype=torch.float64, device=trainer.device)
    if batches is not None:
        found[trainer.rank] = torch.tensor(nonfinite_in(batches), dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(found, op=dist.ReduceOp.SUM)
    rows = found.tolist()
    ranks = [r for r, row in enumerate(rows) if row[0] > 0]
    if not ranks or batches is None:
        return ""
    count, micro, leaf = (int(x) for x in rows[ranks[0]])
    where = [w for w, _ in _tensors(batches[micro], "")][leaf]
    also = f" (ranks with NaN/inf in their batch: {', '.join(map(str, ranks))})"
    return (
        f"the batch of rank {ranks[0]} holds {count} NaN/inf value(s), the first in "
        f"micro-batch {micro}{' at ' + where if where else ''}{also if len(ranks) > 1 else ''}"
    )


def nonfinite_in(batches: list[Batch]) -> tuple[int, int, int]:
    """(NaN/inf values, micro-batch of the first, its tensor's place in the micro-batch) over
    every floating-point tensor (inputs and targets, whatever the collate built)."""
    total, first = 0, (0, 0)
    for m, batch in enumerate(batches):
        for j, (_, tensor) in enumerate(_tensors(batch, "")):
            if not (tensor.is_floating_point() or tensor.is_complex()):
                continue
            bad = int((~torch.isfinite(tensor)).sum())
            if bad and not total:
                first = (m, j)
            total += bad
    return total, *first


def _tensors(batch: Batch, where: str):
    if isinstance(batch, torch.Tensor):
        yield where, batch
    elif isinstance(batch, dict):
        for key, value in batch.items():
            yield from _tensors(value, f"{where}[{key!r}]")
    elif isinstance(batch, list | tuple):
        for i, value in enumerate(batch):
            yield from _tensors(value, f"{where}[{i}]")


def skip_to(trainer: GuardedTrainer, step: int) -> None:
    """From a restored step on to `step` without training: counter, tokens, schedule and data
    position move as if those steps ran; the weights stay the restored ones."""
    skipped = step - trainer.state.step
    trainer.state.step = step
    trainer.state.tokens_seen += skipped * trainer.tokens_per_step
    for _ in range(skipped):
        trainer.scheduler.step()
    trainer.loader.load_state_dict({"next_step": step})


def stop(what: str, advice: str) -> Stop:
    return Stop(
        f"trainer: {what}; the run stopped there and nothing was committed from it (the "
        f"newest checkpoint holds the last finite state): {advice}",
        exit_code=EXIT_NONFINITE,
        save=False,
    )
