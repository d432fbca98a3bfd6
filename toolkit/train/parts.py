"""What a Trainer is made of, in three groups, and what one of its steps measured.

`Learning` is what changes the weights (model, optimizer, schedule, the step strategy that
runs forward/backward over a step's micro-batches, clipping); `Data` what they learn from
(the training loader, the evaluation loader and metric); `Instruments` what watches the run
without changing it (the event sink, FLOP and throughput accounting, fault injection, the
communication timer, the hang watchdog's heartbeat). The composition root
(toolkit.tasks.train) builds the three and the hooks, then the Trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from toolkit.config.fault import FaultConfig
from toolkit.data.loader import Loader
from toolkit.distributed.commtime import CommTimer
from toolkit.events import Sink
from toolkit.train.ensemble_members import Members
from toolkit.train.steps import StepStrategy


class Heartbeat(Protocol):
    """toolkit.telemetry.heartbeat.Heartbeat: the loop reports its phase boundaries."""

    def beat(self, phase: str, step: int) -> None: ...


@dataclass(frozen=True)
class Learning:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    # Forward/backward over a step's micro-batches, clipping, eval forwards: the
    # accumulation loop, or a pipeline schedule (toolkit.train.pipeline).
    strategy: StepStrategy
    grad_clip: float = 1.0
    # trainer.ensemble > 1: the members' bookkeeping (toolkit.train.ensemble_members); the
    # strategy's losses and grad norms are then [K] tensors, one value per member.
    members: Members | None = None


@dataclass(frozen=True)
class Data:
    train: Loader
    val: Loader | None = None
    # (predictions, targets) -> (sum, count), e.g. rank IC; None: the loss only.
    eval_metric: Callable[[torch.Tensor, torch.Tensor], tuple[float, int]] | None = None


@dataclass(frozen=True)
class Instruments:
    sink: Sink
    device: torch.device
    peak_flops: float
    flops_per_sample: float  # model FLOPs of one sample, fwd + bwd
    # A model without analytic FLOPs: counts them on its first micro-batch (once).
    count_flops: Callable[[Any], float] | None = None
    throughput_unit: str = "tokens"  # the model's (its spec's): tokens | samples
    fault: FaultConfig = field(default_factory=FaultConfig)
    comm_timer: CommTimer | None = None  # timing=False: take() reports zeros
    heartbeat: Heartbeat | None = None  # progress for the node agent's hang watchdog


@dataclass(frozen=True)
class StepTiming:
    """One optimizer step as `Trainer.train_step` measured it (seconds)."""

    loss: float  # mean over the ranks that hold one
    grad_norm: float
    forward_backward_s: float
    optimizer_s: float  # clipping, hooks, the votes' all-reduce and the optimizer step
    votes: list[float]  # summed over ranks: the loop's time vote, then every hook's
    compute_s: float  # forward/backward and clipping
    checkpoint_stall_s: float  # the hooks before the optimizer step (a checkpoint's copy)
    optimizer_step_s: float
    exposed_before_votes_s: float  # communication exposed during compute


def breakdown(
    timing: StepTiming, step_time: float, data_wait: float, comm_timer: CommTimer | None
) -> dict[str, float]:
    """Where the step went: the StepRecord fields that add up to step_time_s. Exposed
    communication is taken out of the phase it happened in (compute, or the votes'
    all-reduce that counts as other); with no comm timer it counts as compute / other."""
    busy, exposed = comm_timer.take() if comm_timer is not None else ({}, 0.0)
    compute = max(0.0, timing.compute_s - timing.exposed_before_votes_s)
    known = data_wait + compute + exposed + timing.optimizer_step_s + timing.checkpoint_stall_s
    return {
        "compute_s": compute,
        "comm_exposed_s": exposed,
        "optimizer_step_s": timing.optimizer_step_s,
        "checkpoint_stall_s": timing.checkpoint_stall_s,
        "other_s": max(0.0, step_time - known),
        **{f"comm_{kind}_s": seconds for kind, seconds in busy.items()},
    }
