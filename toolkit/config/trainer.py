"""The training loop's own knobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from toolkit.config.errors import below_minimum, not_one_of
from toolkit.config.targets import IMPORT_PATH, TARGET

GRAD_SYNC_MODES = ("auto", "every", "last")


@dataclass
class TrainerConfig:
    steps: int = 300
    micro_batch_size: int = 8  # sequences per rank per micro-step
    grad_accum: int = 1
    # Sequences per optimizer step over all ranks. None: micro_batch_size * grad_accum * world.
    # When set, it wins: micro_batch_size becomes global / (world * grad_accum).
    global_batch_size: int | None = None
    log_every: int = 10
    eval_every: int = 0  # 0: evaluate only at the end
    eval_batches: int = 4
    # Stop early once the validation loss reaches this (time-to-target); None: run all steps.
    target_val_loss: float | None = None
    time_budget_s: float | None = None
    progress: bool = True  # rich progress bar on rank 0
    # Your own hooks (toolkit.hooks.Hook), built in every rank and called after the
    # toolkit's: [{_target_: mypkg.callbacks.MyCallback, arg: 1}], the other keys keyword
    # arguments. A callback's eval_metrics() go into each eval event and summary.json.
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    # FSDP2's gradient reduction across micro-steps when grad_accum > 1: "every" reduce-scatters
    # each micro-step (sharded gradients accumulate: least memory, accum x the reduce-scatter
    # traffic); "last" only on the last (every rank keeps the whole unsharded gradient in the
    # reduce dtype until then: one reduce-scatter); "auto": the faster of the two that fits,
    # as the performance model predicts it (toolkit.perfmodel.job.grad_sync_choice).
    grad_sync: str = "auto"
    # False: non-final micro-steps keep their parameters unsharded after backward
    # (FSDPModule.set_reshard_after_backward), saving the next forward's all-gathers for
    # the memory of the whole unsharded model. Only matters when grad_accum > 1.
    reshard_between_micro_steps: bool = True
    # A step whose loss or grad norm is NaN/inf (any rank) is never applied to the weights and
    # never checkpointed. stop: end the run there (exit 80, one line naming the step);
    # skip: leave the weights as they were and go on with the next batch; rollback: every
    # rank restores the newest committed checkpoint and goes on after the bad step's batch
    # (the steps since that checkpoint count as taken, their updates are discarded:
    # toolkit.train.nonfinite). Stops as stop does with no checkpoint to restore.
    on_nonfinite: str = "stop"
    # rollback: how many times one run (one attempt) may roll back; the next non-finite
    # step stops it as stop does.
    max_rollbacks: int = 3


NONFINITE_ACTIONS = ("stop", "skip", "rollback")


def problems(t: TrainerConfig, world: int) -> list[str]:
    """Problems with the trainer group for a job of `world` ranks, one line each."""
    p = below_minimum("trainer", t, {"steps": 1, "grad_accum": 1, "max_rollbacks": 0})
    p += not_one_of("trainer", t, {"on_nonfinite": NONFINITE_ACTIONS})
    budget = t.time_budget_s
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        p.append(f"trainer.time_budget_s={budget}: must be a positive number of seconds (or null)")
    if t.target_val_loss is not None and not math.isfinite(t.target_val_loss):
        p.append(f"trainer.target_val_loss={t.target_val_loss}: must be a finite number (or null)")
    p += not_one_of("trainer", t, {"grad_sync": GRAD_SYNC_MODES})
    if t.grad_accum < 1:
        return p
    if t.global_batch_size is not None:
        unit = world * t.grad_accum
        if t.global_batch_size < unit or t.global_batch_size % unit:
            p.append(
                f"trainer.global_batch_size={t.global_batch_size}: must be a positive multiple of "
                f"data-parallel ranks (the world size over tp x pp) x grad_accum = {world} x {t.grad_accum} = {unit}"
            )
    else:
        p += below_minimum("trainer", t, {"micro_batch_size": 1})
    return p + callback_problems(t.callbacks)


def callback_problems(callbacks: list[dict[str, Any]]) -> list[str]:
    """Each callback names its class (or factory) by import path in `_target_`."""
    p = []
    for i, node in enumerate(callbacks):
        target = node.get(TARGET)  # a user's node: a missing _target_ is reported
        if not isinstance(target, str) or not IMPORT_PATH.fullmatch(target):
            p.append(
                f"trainer.callbacks[{i}]._target_={target!r}: not an import path; each "
                "callback is {_target_: module.Class, ...keyword arguments}, e.g. "
                "{_target_: mypkg.callbacks.MyCallback}"
            )
    return p
