"""AdamW (fp32 or low-bit states) and the warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from toolkit.config.optim import OptimConfig
from toolkit.train.lowbit import build_lowbit, state_bytes_per_param

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "state_bytes_per_param"]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW for `cfg.name` (fp32 states, or low-bit ones: toolkit.train.lowbit); no weight
    decay on 1-D parameters (norms, biases). The low-bit step is compiled as
    `cfg.compile_step` says (auto: on CUDA only; docs/kernels.md)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if cfg.name != "adamw":
        on_cuda = next(model.parameters()).device.type == "cuda"
        compile_step = str(cfg.compile_step).lower() == "true" or (
            str(cfg.compile_step).lower() == "auto" and on_cuda
        )
        betas = (cfg.beta1, cfg.beta2)
        return build_lowbit(
            groups, cfg.name, lr=cfg.lr, betas=betas, eps=cfg.eps, compile_step=compile_step
        )
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True
    )


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at `step` (0-based): linear warm-up, then cosine to min_ratio."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    )
