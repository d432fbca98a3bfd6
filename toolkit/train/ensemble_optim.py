"""One AdamW over an ensemble's stacked parameters, with per-member learning rates, weight
decays and warm-ups as [K] tensors broadcast over each stacked tensor's leading dim.

The arithmetic is torch.optim.AdamW's (foreach, not capturable, no amsgrad) written on
stacked tensors, so that a member's update is what its separate run's AdamW does: decay the
weights by 1 - lr * wd, move the moments, divide by the bias-corrected root of the second
moment plus eps, step by lr / (1 - beta1^t). Per member the scalars are computed in float64,
as Python floats are in torch's path, then cast to the parameter's dtype.

A parameter group's `lr` is a multiplier of the members' own learning rates (1 while
training): torch.distributed.checkpoint sets it to 0 to initialise the state without moving
the weights. The schedule (`MemberSchedule`) sets the members' rates each step from their
own peak lr and warm-up (toolkit.train.optim.lr_factor); a dropped member's rate is 0 and
its gradient is zeroed, so its weights stay where they were.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from toolkit.config.optim import OptimConfig
from toolkit.train.optim import lr_factor


class StackedAdamW(torch.optim.Optimizer):
    """AdamW on [K, ...] parameters; `member_lr` and `member_wd` ([K], float64) are set by
    the schedule and the ensemble, `alive` ([K] bool) masks dropped members."""

    def __init__(
        self,
        model: nn.Module,
        cfg: OptimConfig,
        weight_decays: list[float],
        alive: torch.Tensor,
    ):
        # Decayed: a member's >= 2-D parameters (>= 3-D stacked), as param_groups does.
        decay = [p for p in model.parameters() if p.dim() >= 3]
        no_decay = [p for p in model.parameters() if p.dim() < 3]
        defaults = {"lr": 1.0, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps}
        groups = [{"params": decay, "decay": True}, {"params": no_decay, "decay": False}]
        super().__init__(groups, defaults)
        self.num_members = len(weight_decays)
        self.member_wd = torch.tensor(weight_decays, dtype=torch.float64)
        self.member_lr = torch.zeros(self.num_members, dtype=torch.float64)
        self.alive = alive

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # noqa: ARG002 - the Optimizer interface
        live = self.alive.to(torch.float64)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr = self.member_lr * float(group["lr"]) * live  # a dropped member: 0
            wd = self.member_wd if group["decay"] else torch.zeros_like(self.member_wd)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self._update(p, lr, wd, beta1, beta2, group["eps"])

    def _update(
        self,
        p: torch.Tensor,
        lr: torch.Tensor,
        wd: torch.Tensor,
        beta1: float,
        beta2: float,
        eps: float,
    ) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        shape = (-1,) + (1,) * (p.dim() - 1)
        mask = self.alive.to(p.device).view(shape)
        grad = torch.where(mask, p.grad, 0.0)  # a dropped member's NaN stays out
        state["step"] += 1
        t = float(state["step"])
        p.mul_((1 - lr * wd).to(p.device, p.dtype).view(shape))
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = (-lr / (1 - beta1**t)).to(p.device, p.dtype).view(shape)
        denom = state["exp_avg_sq"].sqrt().div_((1 - beta2**t) ** 0.5).add_(eps)
        p.add_(step_size * state["exp_avg"] / denom)


class MemberSchedule:
    """Each member's lr at the step about to run: its peak lr times lr_factor with its own
    warm-up (the job's schedule otherwise). What the loop and the checkpoint use of an
    LRScheduler: step(), get_last_lr() (member 0's, for the ensemble's record),
    member_lrs(), state_dict() / load_state_dict() (the position only, as
    toolkit.train.optim.Schedule: a resume takes this run's settings)."""

    def __init__(
        self,
        optimizer: StackedAdamW,
        cfg: OptimConfig,
        total_steps: int,
        peak_lrs: list[float],
        warmups: list[int],
    ):
        self.optimizer = optimizer
        self.cfg = cfg
        self.total_steps = total_steps
        self.peak_lrs = peak_lrs
        self.warmups = warmups
        self.last_epoch = 0
        self._apply()

    def member_lrs(self) -> list[float]:
        c = self.cfg
        return [
            peak
            * lr_factor(
                self.last_epoch,
                self.total_steps,
                c.schedule,
                warmup,
                c.min_lr_ratio,
                c.decay_fraction,
            )
            for peak, warmup in zip(self.peak_lrs, self.warmups, strict=True)
        ]

    def _apply(self) -> None:
        self.optimizer.member_lr = torch.tensor(self.member_lrs(), dtype=torch.float64)

    def step(self) -> None:
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return self.member_lrs()

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.peak_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_epoch = int(state["last_epoch"])
        self._apply()
