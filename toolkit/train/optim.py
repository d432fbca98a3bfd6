"""The optimizer (the toolkit's AdamW, fp32 or low-bit states, or any torch.optim optimizer
named by import path) and the learning-rate schedule (constant, linear, cosine, wsd)."""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from toolkit.config.errors import switch
from toolkit.config.optim import OptimConfig, OptimTargetConfig
from toolkit.config.targets import TARGET
from toolkit.train.lowbit import build_lowbit, state_bytes_per_param
from toolkit.train.targets import locate

__all__ = [
    "Schedule",
    "build_optimizer",
    "build_scheduler",
    "lr_factor",
    "state_bytes_per_param",
]

log = logging.getLogger(__name__)


def param_groups(model: nn.Module, weight_decay: float | None) -> list[dict[str, Any]]:
    """Decayed (>= 2-D) and not decayed (1-D: norms, biases) parameters. `weight_decay`
    None: the decayed group takes the optimizer's own (its keyword argument or default)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    decayed: dict[str, Any] = {"params": decay}
    if weight_decay is not None:
        decayed["weight_decay"] = weight_decay
    return [decayed, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(
    model: nn.Module, cfg: OptimConfig | OptimTargetConfig
) -> torch.optim.Optimizer:
    """AdamW for `cfg.name` (fp32 states, or low-bit ones: toolkit.train.lowbit), or the
    `_target_` optimizer with its keyword arguments (build_target_optimizer); no weight
    decay on 1-D parameters (norms, biases). The low-bit step is compiled as
    `cfg.compile_step` says (auto: on CUDA only; docs/kernels.md)."""
    if isinstance(cfg, OptimTargetConfig):
        return build_target_optimizer(model, cfg)
    groups = param_groups(model, cfg.weight_decay)
    if cfg.name != "adamw":
        on_cuda = next(model.parameters()).device.type == "cuda"
        compile_step = str(cfg.compile_step).lower() == "true" or (
            str(cfg.compile_step).lower() == "auto" and on_cuda
        )
        betas = (cfg.beta1, cfg.beta2)
        return build_lowbit(
            groups, cfg.name, lr=cfg.lr, betas=betas, eps=cfg.eps, compile_step=compile_step
        )
    kernels = step_kernels(torch.optim.AdamW, cfg.fused, device_of(model))
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kernels
    )


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters live (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def step_kernels(cls: type, fused: str, device: torch.device) -> dict[str, bool]:
    """The keyword that picks how `cls`'s step runs on `device`, as optim.fused says, logged
    with the reason (one line of the run's first lines): fused=True (one kernel for every
    parameter) on CUDA for auto, wherever torch has one for on; foreach=True (a few
    multi-tensor kernels) otherwise. {} for an optimizer that takes neither keyword."""
    accepts = inspect.signature(cls.__init__).parameters
    mode = switch(fused)
    name = f"{cls.__name__} on {device.type}"
    if "fused" in accepts and (mode == "on" or (mode == "auto" and device.type == "cuda")):
        log.info("optimizer: %s, fused kernels (optim.fused=%s)", name, mode)
        return {"fused": True}
    if "foreach" not in accepts:
        log.info("optimizer: %s, its own step (it has no fused or foreach kernels)", name)
        return {}
    why = {
        "off": "optim.fused=off",
        "on": f"optim.fused=on, but {cls.__name__} has no fused kernels",
        "auto": "optim.fused=auto: fused kernels on CUDA only"
        if "fused" in accepts
        else f"optim.fused=auto: {cls.__name__} has no fused kernels",
    }[mode or "auto"]
    log.info("optimizer: %s, foreach kernels (%s)", name, why)
    return {"foreach": True}


def build_target_optimizer(model: nn.Module, cfg: OptimTargetConfig) -> torch.optim.Optimizer:
    """`cfg.target(param_groups, **cfg.kwargs)` by Hydra's instantiate (plain lists and
    dicts, not OmegaConf containers, reach the optimizer and so its saved param_groups)."""
    groups = param_groups(model, None) if cfg.no_decay_1d else [{"params": model.parameters()}]
    kernels: dict[str, bool] = {}
    found, _ = locate(cfg.target)  # the launcher checked that it imports
    if inspect.isclass(found) and not {"fused", "foreach"} & set(cfg.kwargs):  # theirs win
        kernels = step_kernels(found, cfg.fused, device_of(model))
    node = {"_convert_": "all", **cfg.kwargs, **kernels, TARGET: cfg.target, "_partial_": True}
    optimizer = instantiate(node)(groups)
    if not isinstance(optimizer, torch.optim.Optimizer):  # the launcher checked the class
        raise TypeError(f"optim._target_={cfg.target}: built a {type(optimizer).__name__}")
    return optimizer


def lr_factor(
    step: int,
    total_steps: int,
    schedule: str = "cosine",
    warmup_steps: int = 0,
    min_ratio: float = 0.0,
    decay_fraction: float = 0.2,
) -> float:
    """Multiplier of the peak lr at `step` (0-based: the step about to run) of `total_steps`.

    Linear warm-up over `warmup_steps`, then `schedule`: constant (1), linear or cosine from
    1 to `min_ratio` over the remaining steps, or wsd (warm-up, stable, decay): 1 until the
    last `decay_fraction` of total_steps, then linear to `min_ratio`."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    start = warmup_steps
    if schedule == "wsd":
        start = max(warmup_steps, total_steps - max(1, round(decay_fraction * total_steps)))
    progress = min(1.0, max(0.0, (step - start) / max(1, total_steps - start)))
    if schedule == "cosine":
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule in ("linear", "wsd"):
        return 1 - (1 - min_ratio) * progress
    raise ValueError(f"optim.schedule={schedule}: unknown")


class Schedule(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR of this run's config: the peak lr of each parameter group as the optimizer
    was built, times lr_factor. A resume restores the position (steps taken) only, so a new
    optim.lr, schedule or trainer.steps takes effect at the restored step: LambdaLR's own
    load_state_dict would bring back the checkpoint's base lrs (and the optimizer's restored
    param_groups its last lr)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        base_lrs = list(self.base_lrs)
        saved = list(state_dict["base_lrs"])
        super().load_state_dict(state_dict)
        self.base_lrs = base_lrs
        self._last_lr = [
            base * fn(self.last_epoch) for base, fn in zip(base_lrs, self.lr_lambdas, strict=True)
        ]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr, strict=True):
            group["lr"] = lr
        if saved != base_lrs:
            log.info(
                "peak lr %s -> %s (this run's config) from step %d",
                saved,
                base_lrs,
                self.last_epoch,
            )


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig | OptimTargetConfig, total_steps: int
) -> Schedule:
    def factor(step: int) -> float:
        return lr_factor(
            step, total_steps, cfg.schedule, cfg.warmup_steps, cfg.min_lr_ratio, cfg.decay_fraction
        )

    return Schedule(optimizer, factor)
