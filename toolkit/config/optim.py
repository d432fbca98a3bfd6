"""Optimizer and learning-rate schedule.

Two schemas: `OptimConfig` for the toolkit's AdamW variants (`optim=adamw|adamw8bit|
adamw_lowmem`), and `OptimTargetConfig` for any torch.optim optimizer named by import path
(`optim=sgd`, or your own file with `_target_: torch.optim.RAdam`; toolkit.config.targets).
Both carry the same schedule settings. The peak learning rate is `optim.lr` in both: a field
of OptimConfig, and for a `_target_` node the optimizer's own `lr` keyword (its default when
the node leaves it out); the schedule multiplies it by toolkit.train.optim.lr_factor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.config.errors import below_minimum, switch, switch_problems
from toolkit.config.targets import TargetConfig, target_problems

# constant: warm-up, then the peak lr. linear / cosine: warm-up, then down to lr *
# min_lr_ratio at the last step. wsd (warm-up, stable, decay): warm-up, the peak lr, then a
# linear decay to lr * min_lr_ratio over the last decay_fraction of trainer.steps.
SCHEDULES = ("constant", "linear", "cosine", "wsd")
# optim.fused (both schemas), how the step's arithmetic runs (toolkit.train.optim.step_kernels):
# auto: one fused kernel for all parameters on CUDA where the optimizer has one (fused=True), a few
# multi-tensor kernels elsewhere (foreach=True, what CPU runs as before); on: fused wherever
# torch has it (CUDA, and the CPU for AdamW, Adam, SGD); off: foreach everywhere.


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # linear, cosine, wsd decay to lr * min_lr_ratio
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # Low-bit names only: torch.compile the library's per-parameter step. auto: on CUDA only
    # (on CPU the first step compiles for ~1 min on 2 cores with a cold inductor cache, then
    # steps ~5x faster than eager: true pays off for runs of hundreds of steps;
    # docs/kernels.md).
    compile_step: str = "auto"  # auto | true | false
    schedule: str = "cosine"  # constant | linear | cosine | wsd (after the warm-up)
    decay_fraction: float = 0.2  # wsd: the last fraction of trainer.steps that decays
    fused: str = "auto"  # auto | on | off (above SCHEDULES: what each means)

    # adamw: torch.optim.AdamW, fp32 states. adamw8bit / adamw_lowmem: low-bit optimizer
    # states (toolkit.train.optim says which library and why; docs/kernels.md).
    NAMES = ("adamw", "adamw8bit", "adamw_lowmem")
    COMPILE_STEP = ("auto", "true", "false")


@dataclass
class OptimTargetConfig(TargetConfig):
    """A torch.optim.Optimizer by import path; its keyword arguments (lr, momentum,
    weight_decay, betas, ...) are the node's other keys. These fields are the toolkit's."""

    schedule: str = "cosine"  # constant | linear | cosine | wsd (after the warm-up)
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1  # linear, cosine, wsd decay to lr * min_lr_ratio
    decay_fraction: float = 0.2  # wsd: the last fraction of trainer.steps that decays
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # Two parameter groups: 1-D parameters (norms, biases) without weight decay, the rest
    # with the optimizer's weight_decay. false: one group, every parameter decayed alike.
    no_decay_1d: bool = True
    fused: str = "auto"  # auto | on | off, as for OptimConfig (the fused/foreach keywords)

    @property
    def name(self) -> str:
        """What the performance model and planner call the optimizer: its import path."""
        return self.target


def problems(o: OptimConfig | OptimTargetConfig) -> list[str]:
    """Problems with the optimizer group, one line each."""
    if isinstance(o, OptimTargetConfig):
        p = target_problems("optim", o) + _lr_problems(o.kwargs) + _kwarg_problems(o.kwargs)
        p += below_minimum("optim", o, {"warmup_steps": 0})
        p += switch_problems("optim", o, ("fused",))
        if not o.grad_clip >= 0:  # also NaN
            p.append(f"optim.grad_clip={o.grad_clip}: must be >= 0 (0 disables clipping)")
        return p + schedule_problems(o)
    p = below_minimum("optim", o, {"warmup_steps": 0})
    p += switch_problems("optim", o, ("fused",))
    if switch(o.fused) == "on" and o.name != "adamw":
        p.append(
            f"optim.fused=on: {o.name}'s step is torchao's (optim.compile_step compiles it); "
            "use optim.fused=auto or off"
        )
    if o.name not in OptimConfig.NAMES:
        p.append(f"optim.name={o.name}: unknown; allowed: {', '.join(OptimConfig.NAMES)}")
    if str(o.compile_step).lower() not in OptimConfig.COMPILE_STEP:
        p.append(
            f"optim.compile_step={o.compile_step}: unknown; allowed: "
            + ", ".join(OptimConfig.COMPILE_STEP)
        )
    if not (math.isfinite(o.lr) and o.lr > 0):
        p.append(f"optim.lr={o.lr}: must be a finite number > 0")
    if not (math.isfinite(o.grad_clip) and o.grad_clip >= 0):
        p.append(f"optim.grad_clip={o.grad_clip}: must be a finite number >= 0 (0: no clipping)")
    return p + adam_problems(o.beta1, o.beta2, o.eps, o.weight_decay) + schedule_problems(o)


def adam_problems(beta1: Any, beta2: Any, eps: Any, weight_decay: Any) -> list[str]:
    """AdamW's hyperparameters, checked here because NaN passes every comparison: a NaN or
    1.5 beta reaches the ranks and ends the run at step 1 blaming the learning rate."""
    p = []
    for name, beta in (("beta1", beta1), ("beta2", beta2)):
        if not (_finite(beta) and 0 <= beta < 1):
            p.append(f"optim.{name}={beta}: must be a number in [0, 1) (e.g. 0.9, 0.95)")
    if not (_finite(eps) and eps > 0):
        p.append(f"optim.eps={eps}: must be a finite number > 0 (e.g. 1e-8)")
    if not (_finite(weight_decay) and weight_decay >= 0):
        p.append(f"optim.weight_decay={weight_decay}: must be a finite number >= 0 (0: none)")
    return p


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def schedule_problems(o: OptimConfig | OptimTargetConfig) -> list[str]:
    """The schedule settings both schemas share."""
    p = []
    if o.schedule not in SCHEDULES:
        p.append(f"optim.schedule={o.schedule}: unknown; allowed: {', '.join(SCHEDULES)}")
    if not 0 <= o.min_lr_ratio <= 1:
        p.append(f"optim.min_lr_ratio={o.min_lr_ratio}: must be in [0, 1]")
    if not 0 < o.decay_fraction <= 1:
        p.append(f"optim.decay_fraction={o.decay_fraction}: must be in (0, 1]")
    return p


def _kwarg_problems(kwargs: dict[str, Any]) -> list[str]:
    """A `_target_` optimizer's usual keywords, when given, checked as AdamW's are: NaN or
    1.5 would otherwise reach the ranks (torch refuses some there, in a traceback)."""
    p = []
    if "betas" in kwargs:
        betas = kwargs["betas"]
        pair = isinstance(betas, Sequence) and not isinstance(betas, str) and len(betas) == 2
        if not (pair and all(_finite(b) and 0 <= b < 1 for b in betas)):
            p.append(f"optim.betas={betas}: must be two numbers in [0, 1) (e.g. [0.9, 0.95])")
    if "eps" in kwargs and not (_finite(kwargs["eps"]) and kwargs["eps"] > 0):
        p.append(f"optim.eps={kwargs['eps']}: must be a finite number > 0 (e.g. 1e-8)")
    for name in ("weight_decay", "momentum"):
        if name in kwargs and not (_finite(kwargs[name]) and kwargs[name] >= 0):
            p.append(f"optim.{name}={kwargs[name]}: must be a finite number >= 0")
    return p


def _lr_problems(kwargs: dict[str, Any]) -> list[str]:
    """A `_target_` optimizer's `lr` keyword, when given, is a finite number > 0."""
    if "lr" not in kwargs:
        return []
    lr = kwargs["lr"]
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or lr <= 0:
        return [f"optim.lr={lr}: must be a finite number > 0 (the schedule's peak lr)"]
    return []
