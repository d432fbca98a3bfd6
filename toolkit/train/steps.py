"""How a training step turns its micro-batches into gradients: the Trainer delegates
forward/backward, gradient clipping and evaluation forwards to one of these.

`Accumulation` runs the micro-batches one after the other on the whole model, accumulating
gradients (FSDP2 reduces them after every micro-step or once, after the last:
trainer.grad_sync). Pipeline parallelism has its own
(toolkit.train.pipeline.PipelineStep) with the same methods."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from toolkit.distributed.commtime import CommTimer
from toolkit.distributed.fsdp import clip_grad_norm_
from toolkit.train.models.spec import Batch, LossFn, pair_loss, to_device

# A step's micro-batches: (inputs, targets) pairs from the built-in data, or whatever your
# collate function returns (toolkit.train.models.spec.Batch).
MicroBatches = list[Batch]
Predict = Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]
EvalResult = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


class StepStrategy(Protocol):
    # Ranks whose forward_backward returns the loss (the others return 0): the summed
    # loss divided by this is the mean over the global batch.
    loss_ranks: int

    def forward_backward(self, micro_batches: MicroBatches) -> torch.Tensor: ...

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor: ...

    def eval_batch(self, batch: Batch, predictions: bool) -> EvalResult:
        """(loss, predictions, targets): Nones where this rank holds no loss, and no
        predictions unless asked and known."""
        ...


class Accumulation:
    """Forward and backward of each micro-batch in turn on the whole model.

    `grad_sync` "last": non-final micro-steps skip FSDP's reduce-scatter
    (set_requires_gradient_sync), so gradients accumulate unsharded locally and are reduced
    once; "every": each micro-step reduce-scatters and the sharded gradients accumulate,
    HSDP's replica all-reduce still only on the last (set_requires_all_reduce).
    `reshard_between_micro_steps` False: non-final micro-steps keep their parameters
    unsharded after backward (set_reshard_after_backward), so the next forward gathers
    nothing. Forward and backward run
    in `loss_context` (loss_parallel() under tensor parallelism); a micro-batch's loss is
    the model spec's (`loss`), its predictions for an eval metric the spec's `predict`."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        loss_context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
        timer: CommTimer | None = None,
        loss: LossFn = pair_loss,
        predict: Predict | None = None,
        grad_sync: str = "last",
        reshard_between_micro_steps: bool = True,
    ):
        self.model = model
        self.device = device
        self.loss_context = loss_context
        self.timer = timer  # clipping's all-reduce is timed as communication
        self.loss = loss
        self.predict = predict
        self.grad_sync = grad_sync
        self.reshard_between_micro_steps = reshard_between_micro_steps
        self.loss_ranks = dist.get_world_size()  # tp peers hold the same loss: still the mean

    def forward_backward(self, micro_batches: MicroBatches) -> torch.Tensor:
        """This rank's mean loss over its micro-batches (gradients left in .grad)."""
        accum = len(micro_batches)
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        for i, batch in enumerate(micro_batches):
            if isinstance(self.model, FSDPModule):
                self.sync_micro_step(self.model, last=i == accum - 1)
            batch = to_device(batch, self.device)
            with self.loss_context():
                loss = self.loss(self.model, batch) / accum
                loss.backward()
            loss_sum += loss.detach().float()
        return loss_sum

    def sync_micro_step(self, model: FSDPModule, last: bool) -> None:
        """What FSDP2 does at the end of this micro-step's backward (every unit: recurse)."""
        every = self.grad_sync == "every"
        model.set_requires_gradient_sync(last or every)
        if every:
            model.set_requires_all_reduce(last)  # HSDP: replicas agree once per step
        if not self.reshard_between_micro_steps:
            model.set_reshard_after_backward(last)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm_(self.model, max_norm, self.timer)

    def eval_batch(self, batch: Batch, predictions: bool) -> EvalResult:
        """The batch's loss and, when asked (and the spec says them), the model's
        predictions and the targets they are scored against."""
        batch = to_device(batch, self.device)
        with self.loss_context():
            loss = self.loss(self.model, batch)
        if predictions and self.predict is not None:
            preds, targets = self.predict(self.model, batch)
            return loss, preds, targets
        return loss, None, None
