"""How a training step turns its micro-batches into gradients: the Trainer delegates
forward/backward, gradient clipping and evaluation forwards to one of these.

`Accumulation` runs the micro-batches one after the other on the whole model, accumulating
gradients (FSDP2 reduces them once, after the last). Pipeline parallelism has its own
(toolkit.train.pipeline.PipelineStep) with the same methods."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from toolkit.distributed.commtime import CommTimer
from toolkit.distributed.fsdp import clip_grad_norm_

MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]


class StepStrategy(Protocol):
    # Ranks whose forward_backward returns the loss (the others return 0): the summed
    # loss divided by this is the mean over the global batch.
    loss_ranks: int

    def forward_backward(self, micro_batches: MicroBatches) -> torch.Tensor: ...

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor: ...

    def eval_batch(
        self, inputs: torch.Tensor, targets: torch.Tensor, predictions: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]: ...


class Accumulation:
    """Forward and backward of each micro-batch in turn on the whole model.

    Non-final micro-steps skip FSDP's reduce-scatter (set_requires_gradient_sync), so
    gradients accumulate unsharded locally and are reduced once. Forward and backward run
    in `loss_context` (loss_parallel() under tensor parallelism)."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        loss_context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
        timer: CommTimer | None = None,
    ):
        self.model = model
        self.device = device
        self.loss_context = loss_context
        self.timer = timer  # clipping's all-reduce is timed as communication
        self.loss_ranks = dist.get_world_size()  # tp peers hold the same loss: still the mean

    def forward_backward(self, micro_batches: MicroBatches) -> torch.Tensor:
        """This rank's mean loss over its micro-batches (gradients left in .grad)."""
        accum = len(micro_batches)
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        for i, (inputs, targets) in enumerate(micro_batches):
            if hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(i == accum - 1)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self.loss_context():
                loss = self.model(inputs, targets) / accum
                loss.backward()
            loss_sum += loss.detach()
        return loss_sum

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm_(self.model, max_norm, self.timer)

    def eval_batch(
        self, inputs: torch.Tensor, targets: torch.Tensor, predictions: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The batch's loss and, when asked, the model's predictions."""
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        with self.loss_context():
            loss = self.model(inputs, targets)
        return loss, (self.model(inputs) if predictions else None)
