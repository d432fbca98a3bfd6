"""Optimizer and learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.config.errors import below_minimum


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
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

    # adamw: torch.optim.AdamW, fp32 states. adamw8bit / adamw_lowmem: low-bit optimizer
    # states (toolkit.train.optim says which library and why; docs/kernels.md).
    NAMES = ("adamw", "adamw8bit", "adamw_lowmem")
    COMPILE_STEP = ("auto", "true", "false")


def problems(o: OptimConfig) -> list[str]:
    """Problems with the optimizer group, one line each."""
    p = below_minimum("optim", o, {"warmup_steps": 0})
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
    return p
