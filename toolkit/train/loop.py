"""The training loop: micro-batches with gradient accumulation, clipping, schedule, metrics.

The loop knows nothing about checkpointing, telemetry or preemption: those attach as hooks
(`toolkit.hooks`), called on rank-symmetric points so that collectives inside hooks are
safe. Per step the loop runs one all-reduce besides the model's own: the loss, the loop's
own stop vote (time budget) and every hook's votes, summed together. Injected faults (tests,
drills: the fault group) are a FaultInjector's (toolkit.train.faults), called at four points.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from toolkit.config.shape import split_global_batch
from toolkit.config.trainer import TrainerConfig
from toolkit.errors import EXIT_RESUME_REFUSED, UserError
from toolkit.events import Event, StepRecord
from toolkit.hooks import Hook, Stop, split_votes, step_metrics
from toolkit.train.flops import mfu
from toolkit.train.nonfinite import NonfiniteGuard
from toolkit.train.parts import Data, Instruments, Learning, StepTiming
from toolkit.train.steps import MicroBatches
from toolkit.train.watch import Watch

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    step: int = 0  # optimizer steps completed
    tokens_seen: int = 0


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


class Trainer:
    """The loop over optimizer steps, made of its parts (toolkit.train.parts): what learns,
    what it learns from, what watches it; the hooks and the mesh layout it reports."""

    def __init__(
        self,
        cfg: TrainerConfig,
        learning: Learning,
        data: Data,
        instruments: Instruments,
        *,
        hooks: list[Hook] | None = None,
        layout: dict[str, int] | None = None,
    ):
        self.cfg = cfg
        self.model = learning.model
        self.optimizer = learning.optimizer
        self.scheduler = learning.scheduler
        self.strategy = learning.strategy
        self.grad_clip = learning.grad_clip
        self.members = learning.members  # an ensemble's (trainer.ensemble > 1), else None
        self.loader = data.train
        self.val_loader = data.val
        self.eval_metric = data.eval_metric
        self.sink = instruments.sink
        self.device = instruments.device
        self.flops_per_sample = instruments.flops_per_sample
        self.count_flops = instruments.count_flops
        self.peak_flops = instruments.peak_flops
        self.throughput_unit = instruments.throughput_unit
        self.hooks = list(hooks or [])
        self.layout = dict(layout or {})  # mesh degrees, for the summary
        self.val_metrics: dict[str, float] = {}
        self.rank = dist.get_rank()
        # heartbeat, fault points, communication bookkeeping
        self.watch = Watch(
            instruments.fault, self.rank, instruments.comm_timer, instruments.heartbeat
        )
        self.world_size = dist.get_world_size()
        self.state = TrainState()
        self.losses: list[float] = []
        self.records: list[StepRecord] = []
        self.stop: Stop | None = None
        self.nonfinite = False  # the last step's loss or grad norm was NaN/inf (not applied)
        self.nonfinite_guard = NonfiniteGuard(cfg)  # then: stop, skip or roll back
        self._started = time.time()
        plan = self.loader.plan
        self.tokens_per_step = plan.global_batch_size * plan.seq_len
        self.samples_per_step = plan.global_batch_size
        # Each sample goes through every member: K models' FLOPs per sample for MFU.
        self.num_models = len(self.members.members) if self.members is not None else 1

    # -- what hooks see (toolkit.hooks.TrainerView) -------------------------------------
    @property
    def step(self) -> int:
        return self.state.step

    @property
    def total_steps(self) -> int:
        return self.cfg.steps

    @property
    def stop_reason(self) -> str:
        return self.stop.reason if self.stop is not None else "running"

    def state_dict(self) -> dict[str, Any]:
        """Everything but model and optimizer that an exact resume needs (JSON-able)."""
        return {
            "step": self.state.step,
            "tokens_seen": self.state.tokens_seen,
            "scheduler": self.scheduler.state_dict(),
            "loader": self.loader.state_dict(),
            "world_size": self.world_size,
            "global_batch_size": self.loader.plan.global_batch_size,
            "micro_batch_size": self.loader.plan.micro_batch_size,
            "grad_accum": self.loader.plan.grad_accum,
            **({"members": self.members.state_dict()} if self.members is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: counters, schedule, data position, and the checkpoint's global batch
        (unless trainer.global_batch_size sets one), split over this job's ranks."""
        self.state.step = int(state["step"])
        self.state.tokens_seen = int(state["tokens_seen"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.loader.load_state_dict(state["loader"])
        if self.members is not None and "members" in state:
            self.members.load_state_dict(state["members"])
        saved = state.get("global_batch_size")
        if saved is not None and self.cfg.global_batch_size is None:
            self.use_global_batch(int(saved))

    def use_global_batch(self, global_batch: int) -> None:
        """Re-split the batch plan so that a step sees `global_batch` sequences: the same
        windows in the same order as any other world size (toolkit.data.loader)."""
        plan = self.loader.plan
        if global_batch == plan.global_batch_size:
            return
        dp = plan.world_size  # data-parallel ranks (tp and pp peers share a slice)
        split = split_global_batch(global_batch, dp, plan.grad_accum)
        if split is None:
            raise UserError(
                f"cannot resume on {dp} data-parallel ranks: the checkpoint's global batch of "
                f"{global_batch} sequences does not split over them; resume on a world size "
                f"that divides {global_batch}, or set trainer.global_batch_size (a multiple of "
                f"{dp}) with checkpoint.allow_config_change=true",
                EXIT_RESUME_REFUSED,
            )
        micro, accum = split
        log.info(
            "keeping the checkpoint's global batch of %d sequences: micro-batch %d x "
            "accumulation %d x %d ranks (was %d x %d)",
            global_batch,
            micro,
            accum,
            dp,
            plan.micro_batch_size,
            plan.grad_accum,
        )
        self.loader.plan = dataclasses.replace(plan, micro_batch_size=micro, grad_accum=accum)
        if self.val_loader is not None:
            val = self.val_loader.plan
            self.val_loader.plan = dataclasses.replace(val, micro_batch_size=micro)
        self.tokens_per_step = global_batch * plan.seq_len
        self.samples_per_step = global_batch

    # -- one optimizer step ------------------------------------------------------------
    def train_step(self, micro_batches: MicroBatches) -> StepTiming:
        """Forward/backward over the micro-batches (self.strategy), then clip and step."""
        t0 = time.perf_counter()
        self.watch.compute()
        loss_sum = self.strategy.forward_backward(micro_batches)
        t1 = time.perf_counter()
        grad_norm = self.strategy.clip_grad_norm(self.grad_clip)
        t_clip = time.perf_counter()
        for hook in self.hooks:
            hook.before_optimizer_step(self)
        t_hooks = time.perf_counter()
        exposed_so_far = self.watch.exposed_s()
        # One all-reduce over every rank (all pipeline stages) carries the loss, a non-finite
        # flag and every stop vote; .tolist() syncs the device. Ranks without a loss (not the
        # last pipeline stage) add 0: the mean divides by the ranks that hold one. It comes
        # before the optimizer step so that a NaN/inf loss or grad norm (the norm is global
        # already) on any rank is never applied to the weights: no extra sync for the guard.
        # An ensemble's losses and norms hold one value per member: K of each, then votes.
        votes = [self._time_up()] + [v for hook in self.hooks for v in hook.votes(self)]
        losses = loss_sum.detach().reshape(-1)
        norms = torch.as_tensor(grad_norm).reshape(-1)
        nonfinite = ~(torch.isfinite(losses) & torch.isfinite(norms).to(self.device))
        k = losses.numel()
        self.watch.before_all_reduce(self.state.step)
        summed = torch.cat(
            [losses, nonfinite.to(losses.dtype), torch.tensor(votes, device=self.device)]
        )
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        values = summed.tolist()
        t_reduced = time.perf_counter()
        step_losses = [v / self.strategy.loss_ranks for v in values[:k]]
        step_norms = norms.tolist()
        bad = [v > 0 for v in values[k : 2 * k]]
        loss, norm = step_losses[0], step_norms[0]
        self.nonfinite = bad[0]
        if self.members is not None:  # a member that went non-finite is dropped here
            self.members.observe(step_losses, step_norms, bad, self.state.step + 1)
            loss, norm = self.members.live_mean(step_losses), self.members.live_mean(step_norms)
            self.nonfinite = self.members.num_alive == 0  # the run's guard: none left
        if not self.nonfinite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        t_opt = time.perf_counter()
        return StepTiming(
            loss=loss,
            grad_norm=norm,
            forward_backward_s=t1 - t0,
            optimizer_s=t_opt - t1,
            votes=values[2 * k :],
            compute_s=t_clip - t0,
            checkpoint_stall_s=t_hooks - t_clip,
            optimizer_step_s=t_opt - t_reduced,
            exposed_before_votes_s=exposed_so_far,
        )

    def _time_up(self) -> float:
        budget = self.cfg.time_budget_s
        return float(budget is not None and time.time() - self._started >= budget)

    @torch.no_grad()
    def evaluate(self) -> float | None:
        if self.val_loader is None or self.cfg.eval_batches <= 0:
            return None
        self.model.eval()
        plan = self.val_loader.plan
        # metric, count, then the loss (an ensemble's: one per member)
        k = len(self.members.members) if self.members is not None else 1
        total = torch.zeros(2 + k, device=self.device, dtype=torch.float64)
        for i in range(self.cfg.eval_batches):
            for batch in self.val_loader.batch(i):
                want = self.eval_metric is not None
                loss, preds, targets = self.strategy.eval_batch(batch, want)
                if loss is None:  # not the last pipeline stage: nothing to add
                    continue
                total[2:] += loss.detach().double().reshape(-1)
                if preds is not None and targets is not None and self.eval_metric is not None:
                    metric, count = self.eval_metric(preds, targets)
                    total[0] += metric
                    total[1] += count
        self.model.train()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if self.eval_metric is not None and total[1] > 0:
            self.val_metrics["val_ic"] = float(total[0] / total[1])
        for hook in self.hooks:  # e.g. a user's callback (trainer.callbacks)
            self.val_metrics.update(hook.eval_metrics(self))
        batches = self.strategy.loss_ranks * self.cfg.eval_batches * plan.grad_accum
        val_losses = [v / batches for v in total[2:].tolist()]
        if self.members is None:
            return val_losses[0]
        self.members.write_eval(self.state.step, val_losses)
        return self.members.live_mean(val_losses)

    # -- the loop ----------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        self._started = time.time()
        for hook in self.hooks:
            hook.on_start(self)
        self.loader.load_state_dict({"next_step": self.state.step})
        val_loss = None
        stop: Stop | None = None
        stopped_by_hook = False
        self.model.train()
        try:
            while stop is None and self.state.step < self.cfg.steps:
                self._beat("data")
                t_wait = time.perf_counter()
                micro_batches = self._next_batches()
                data_wait = time.perf_counter() - t_wait
                self._beat("step")
                self.watch.step_starts(self.state.step)
                lrs = self.scheduler.get_last_lr()  # an ensemble's: one per member
                lr = lrs[0]
                timing = self.train_step(micro_batches)
                step_time = time.perf_counter() - t_wait
                self._count_flops_once(micro_batches)  # outside the step's own time
                record = self._advance(timing, step_time, data_wait, lr)
                record.metrics.update(step_metrics(self.hooks, self, micro_batches))
                loss, grad_norm = timing.loss, timing.grad_norm
                self.losses.append(loss)
                self.records.append(record)
                self.sink.write_step(record)
                if self.members is not None:
                    self.members.write_step(record, lrs)
                if self.nonfinite:
                    stop = self.nonfinite_guard.after_step(self, loss, grad_norm, micro_batches)
                    if stop is not None:  # no hook sees this step: nothing is saved from it
                        stopped_by_hook = True
                        break
                self._beat("hooks")
                votes = timing.votes
                for hook, share in zip(self.hooks, split_votes(self.hooks, votes[1:]), strict=True):
                    stop = hook.after_step(self, record, share) or stop
                stopped_by_hook = stop is not None
                if stop is None and self._should_eval():
                    self._beat("eval")
                    val_loss = self._eval_event()
                    target = self.cfg.target_val_loss
                    if target is not None and val_loss is not None and val_loss <= target:
                        stop = Stop("target validation loss reached")
                if stop is None and votes[0] > 0:
                    stop = Stop("time budget reached")
            stop = stop or Stop("completed")
            self._beat("hooks")
            for hook in self.hooks:  # e.g. the final checkpoint starts here
                stop = hook.on_stop(self, stop) or stop
            # A hook stop (preemption) must exit within the signal's lead time: no final eval.
            if not stopped_by_hook and (stop.reason == "completed" or val_loss is None):
                val_loss = self._eval_event() if self.val_loader is not None else None
        finally:
            self._beat("hooks")  # on_end may wait for the last background save
            self.stop = stop
            self.loader.close()
            for hook in self.hooks:
                hook.on_end(self)
        self._beat("end")
        return self.summary(time.time() - self._started, val_loss)

    def _beat(self, phase: str) -> None:
        self.watch.phase(phase, self.state.step, started=bool(self.records))

    def _next_batches(self) -> MicroBatches:
        data_step, micro_batches = next(self.loader)
        self.watch.data_fetched()
        if data_step != self.state.step:
            raise RuntimeError(f"data loader at step {data_step}, trainer at {self.state.step}")
        return micro_batches

    def _advance(
        self, timing: StepTiming, step_time: float, data_wait: float, lr: float
    ) -> StepRecord:
        """Count the step done and say what it measured."""
        self.state.step += 1
        self.state.tokens_seen += self.tokens_per_step
        samples_per_s = self.samples_per_step / step_time
        return StepRecord(
            step=self.state.step,
            wall_time=time.time(),
            step_time_s=step_time,
            data_wait_s=data_wait,
            forward_backward_s=timing.forward_backward_s,
            optimizer_s=timing.optimizer_s,
            loss=timing.loss,
            grad_norm=timing.grad_norm,
            lr=lr,
            tokens=self.tokens_per_step,
            tokens_per_s=self.tokens_per_step / step_time,
            samples_per_s=samples_per_s,
            mfu=mfu(
                samples_per_s * self.num_models,
                self.flops_per_sample,
                self.peak_flops,
                self.world_size,
            ),
            mem_peak_bytes=peak_memory_bytes(self.device),
            rank=self.rank,
            epoch=getattr(self.loader, "epoch", 0),  # a benchmark's loader may count none
            **self.watch.breakdown(timing, step_time, data_wait),
        )

    def _count_flops_once(self, micro_batches: MicroBatches) -> None:
        """A model without analytic FLOPs counts them on its first micro-batch (once)."""
        if self.count_flops is not None:
            self.flops_per_sample = self.count_flops(micro_batches[0])
            self.count_flops = None

    def _should_eval(self) -> bool:
        every = self.cfg.eval_every
        return every > 0 and self.state.step % every == 0 and self.state.step < self.cfg.steps

    def _eval_event(self) -> float | None:
        start = time.time()
        val_loss = self.evaluate()
        if val_loss is not None:
            self.sink.write_event(
                Event(
                    "eval",
                    start,
                    time.time(),
                    self.state.step,
                    self.rank,
                    {"val_loss": val_loss, **self.val_metrics},
                )
            )
        return val_loss

    def summary(self, elapsed_s: float, val_loss: float | None) -> dict[str, Any]:
        # Skip the first step (allocation, compile) unless that is all there is.
        measured = self.records[1:] or self.records
        return {
            "steps": self.state.step,
            "steps_this_run": len(self.records),
            "epoch": self.records[-1].epoch if self.records else None,
            "time_s": elapsed_s,
            "tokens_seen": self.state.tokens_seen,
            "median_tokens_per_s": statistics.median(r.tokens_per_s for r in measured)
            if measured
            else 0.0,
            "median_samples_per_s": statistics.median(r.samples_per_s for r in measured)
            if measured
            else 0.0,
            "median_mfu": statistics.median(r.mfu for r in measured) if measured else 0.0,
            "median_step_time_s": statistics.median(r.step_time_s for r in measured)
            if measured
            else 0.0,
            # Time the loop waited for data, as a share of step time (steps after the first).
            "data_wait_share": sum(r.data_wait_s for r in measured)
            / max(sum(r.step_time_s for r in measured), 1e-12),
            "first_loss": self.losses[0] if self.losses else None,
            "final_loss": self.losses[-1] if self.losses else None,
            "val_loss": val_loss,
            **self.val_metrics,
            "peak_memory_bytes": max((r.mem_peak_bytes for r in self.records), default=0),
            "stop_reason": self.stop_reason,
            "exit_code": self.stop.exit_code if self.stop is not None else 0,
            "world_size": self.world_size,
            "layout": self.layout,
            "throughput_unit": self.throughput_unit,
        }
