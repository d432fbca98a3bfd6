"""The training loop: micro-batches with gradient accumulation, clipping, schedule, metrics.

The loop knows nothing about checkpointing, telemetry or preemption: those attach as hooks
(`Hook`), called on rank-symmetric points so that collectives inside hooks are safe.
"""

from __future__ import annotations

import logging
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from toolkit.config.trainer import TrainerConfig
from toolkit.distributed.fsdp import clip_grad_norm_
from toolkit.train.data import Loader
from toolkit.train.flops import mfu
from toolkit.train.metrics import Event, Sink, StepRecord

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    step: int = 0  # optimizer steps completed
    tokens_seen: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Hook(Protocol):
    """Attach behaviour to the loop. All ranks call each method at the same point."""

    def on_start(self, trainer: Trainer) -> None: ...

    def before_optimizer_step(self, trainer: Trainer) -> None:
        """Called after forward/backward and clipping, right before parameters and optimizer
        state change (e.g. to wait for a checkpoint's copy of them)."""
        ...

    def after_step(self, trainer: Trainer, record: StepRecord) -> bool:
        """Return True to stop training after this step (e.g. preemption)."""
        ...

    def on_end(self, trainer: Trainer) -> None: ...


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


class Trainer:
    def __init__(
        self,
        cfg: TrainerConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        loader: Loader,
        sink: Sink,
        *,
        device: torch.device,
        flops_per_token: float,
        peak_flops: float,
        val_loader: Loader | None = None,
        hooks: list[Hook] | None = None,
        grad_clip: float = 1.0,
    ):
        self.cfg = cfg
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loader = loader
        self.val_loader = val_loader
        self.sink = sink
        self.device = device
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.hooks = hooks or []
        self.grad_clip = grad_clip
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.state = TrainState()
        self.losses: list[float] = []
        self.records: list[StepRecord] = []
        self.stop_reason = "completed"
        plan = loader.plan
        self.tokens_per_step = plan.global_batch_size * plan.seq_len

    # -- one optimizer step ------------------------------------------------------------
    def train_step(
        self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[float, float, float, float]:
        """Forward/backward over the micro-batches, then clip and step.

        Non-final micro-steps skip FSDP's reduce-scatter (set_requires_gradient_sync), so
        gradients accumulate unsharded locally and are reduced once."""
        t0 = time.perf_counter()
        accum = len(micro_batches)
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        for i, (inputs, targets) in enumerate(micro_batches):
            last = i == accum - 1
            if hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(last)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            loss = self.model(inputs, targets) / accum
            loss.backward()
            loss_sum += loss.detach()
        t1 = time.perf_counter()
        grad_norm = clip_grad_norm_(self.model, self.grad_clip)
        for hook in self.hooks:
            hook.before_optimizer_step(self)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        loss_value = loss_sum.item() / self.world_size  # .item() synchronises the device
        t2 = time.perf_counter()
        return loss_value, float(grad_norm), t1 - t0, t2 - t1

    @torch.no_grad()
    def evaluate(self) -> float | None:
        if self.val_loader is None or self.cfg.eval_batches <= 0:
            return None
        self.model.eval()
        plan = self.val_loader.plan
        total = torch.zeros((), device=self.device)
        for i in range(self.cfg.eval_batches):
            for inputs, targets in plan.micro_batches(self.val_loader.source, "val", i):
                total += self.model(inputs.to(self.device), targets.to(self.device)).float()
        self.model.train()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.item() / (self.world_size * self.cfg.eval_batches * plan.grad_accum)

    def _agree_stop(self, local: bool) -> bool:
        flag = torch.tensor([1.0 if local else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    # -- the loop ----------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        for hook in self.hooks:
            hook.on_start(self)
        self.loader.load_state_dict({"next_step": self.state.step})
        started = time.time()
        val_loss = None
        self.model.train()
        try:
            while self.state.step < self.cfg.steps:
                t_wait = time.perf_counter()
                data_step, micro_batches = next(self.loader)
                data_wait = time.perf_counter() - t_wait
                if data_step != self.state.step:
                    raise RuntimeError(
                        f"data loader at step {data_step}, trainer at {self.state.step}"
                    )
                if self.cfg.fail_at_step == self.state.step + 1 and self.rank == self.cfg.fail_rank:
                    raise RuntimeError(
                        f"injected failure at step {self.state.step + 1} (trainer.fail_at_step)"
                    )
                lr = self.scheduler.get_last_lr()[0]
                loss, grad_norm, fb_s, opt_s = self.train_step(micro_batches)
                step_time = time.perf_counter() - t_wait
                self.state.step += 1
                self.state.tokens_seen += self.tokens_per_step
                tps = self.tokens_per_step / step_time
                record = StepRecord(
                    step=self.state.step,
                    wall_time=time.time(),
                    step_time_s=step_time,
                    data_wait_s=data_wait,
                    forward_backward_s=fb_s,
                    optimizer_s=opt_s,
                    loss=loss,
                    grad_norm=grad_norm,
                    lr=lr,
                    tokens=self.tokens_per_step,
                    tokens_per_s=tps,
                    mfu=mfu(tps, self.flops_per_token, self.peak_flops, self.world_size),
                    mem_peak_bytes=peak_memory_bytes(self.device),
                    rank=self.rank,
                )
                self.losses.append(loss)
                self.records.append(record)
                self.sink.write_step(record)
                stop = False
                for hook in self.hooks:
                    stop = hook.after_step(self, record) or stop
                if stop:
                    self.stop_reason = "stopped by hook"
                    break
                if self._should_eval():
                    val_loss = self._eval_event()
                    if (
                        self.cfg.target_val_loss is not None
                        and val_loss <= self.cfg.target_val_loss
                    ):
                        self.stop_reason = "target validation loss reached"
                        break
                if self.cfg.time_budget_s is not None and self._agree_stop(
                    time.time() - started >= self.cfg.time_budget_s
                ):
                    self.stop_reason = "time budget reached"
                    break
            # A hook stop (preemption) must exit within the signal's lead time: no final eval.
            stopped_by_hook = self.stop_reason == "stopped by hook"
            if not stopped_by_hook and (self.stop_reason == "completed" or val_loss is None):
                val_loss = self._eval_event() if self.val_loader is not None else None
        finally:
            self.loader.close()
            for hook in self.hooks:
                hook.on_end(self)
        return self.summary(time.time() - started, val_loss)

    def _should_eval(self) -> bool:
        every = self.cfg.eval_every
        return every > 0 and self.state.step % every == 0 and self.state.step < self.cfg.steps

    def _eval_event(self) -> float | None:
        start = time.time()
        val_loss = self.evaluate()
        if val_loss is not None:
            self.sink.write_event(
                Event(
                    "eval", start, time.time(), self.state.step, self.rank, {"val_loss": val_loss}
                )
            )
        return val_loss

    def summary(self, elapsed_s: float, val_loss: float | None) -> dict[str, Any]:
        # Skip the first step (allocation, compile) unless that is all there is.
        measured = self.records[1:] or self.records
        return {
            "steps": self.state.step,
            "steps_this_run": len(self.records),
            "time_s": elapsed_s,
            "tokens_seen": self.state.tokens_seen,
            "median_tokens_per_s": statistics.median(r.tokens_per_s for r in measured)
            if measured
            else 0.0,
            "median_mfu": statistics.median(r.mfu for r in measured) if measured else 0.0,
            "median_step_time_s": statistics.median(r.step_time_s for r in measured)
            if measured
            else 0.0,
            "first_loss": self.losses[0] if self.losses else None,
            "final_loss": self.losses[-1] if self.losses else None,
            "val_loss": val_loss,
            "peak_memory_bytes": max((r.mem_peak_bytes for r in self.records), default=0),
            "stop_reason": self.stop_reason,
            "world_size": self.world_size,
        }
