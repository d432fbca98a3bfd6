"""What an ensemble adds to a Trainer's parts, built in one call from its own configs: the
stacked members, their step strategy, their AdamW and schedule, and their bookkeeping
(toolkit.train.ensemble, ensemble_optim, ensemble_members)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from toolkit.config.optim import OptimConfig
from toolkit.config.trainer import TrainerConfig
from toolkit.train.ensemble import EnsembleStep, Stack, build_stack, resolve_members
from toolkit.train.ensemble_members import Members
from toolkit.train.ensemble_optim import MemberSchedule, StackedAdamW
from toolkit.train.models.spec import LossFn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnsembleParts:
    stack: Stack
    step: EnsembleStep
    optimizer: StackedAdamW
    scheduler: MemberSchedule
    members: Members


def build_ensemble(
    trainer: TrainerConfig,
    optim: OptimConfig,
    seed: int,
    build: Callable[[], nn.Module],
    loss: LossFn,
    device: torch.device,
    run_dir: Path,
    rank: int,
    compute_dtype: torch.dtype = torch.float32,
    data_seed: int | None = None,
) -> EnsembleParts:
    """trainer.ensemble members of the model `build()` makes (each after its own seed),
    computing in `compute_dtype` (precision.param_dtype; autocast when not fp32), over the
    data order of `data_seed` (data.order_seed, or the job's seed; recorded in member.json)."""
    members = resolve_members(trainer, seed, optim)
    stack = build_stack(build, members, loss, device)
    bookkeeping = Members(members, run_dir, rank, seed if data_seed is None else data_seed)
    alive = bookkeeping.alive
    optimizer = StackedAdamW(stack.model, optim, [m.weight_decay for m in members], alive)
    scheduler = MemberSchedule(
        optimizer,
        optim,
        trainer.steps,
        [m.lr for m in members],
        [m.warmup_steps for m in members],
    )
    if rank == 0:
        log.info(
            "ensemble: %d members of one model in each rank (%s), stacked and run by "
            "torch.func.vmap; gradients averaged over the ranks by one all-reduce",
            len(members),
            ", ".join(f"{m.name}: seed {m.seed}, lr {m.lr:g}" for m in members),
        )
    step = EnsembleStep(stack, device, alive, compute_dtype)
    return EnsembleParts(stack, step, optimizer, scheduler, bookkeeping)
