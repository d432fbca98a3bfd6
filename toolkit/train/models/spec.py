"""The model contract: one ModelSpec per kind of model says everything the toolkit needs of
it, so that no other module asks which model it is.

A spec says how to build the model from its own typed config, which modules FSDP2 shards
one by one (activation checkpointing and torch.compile wrap the same units), how to
initialise parameters (also after meta-device init), the loss of a micro-batch, and,
optionally, a tensor-parallel plan, a pipeline split, analytic FLOPs, and the predictions
an eval metric reads. The built-in GPT and time-series transformer are two specs
(toolkit.train.models.registry); your own model is a spec too: built by import path
(`model._target_`), registered by your package (`toolkit.models` entry points), or a
Hugging Face causal LM.

A micro-batch is whatever the loader yields: the built-in data gives an (inputs, targets)
pair, your own collate function any tensor, tuple, list or dict of tensors. `to_device`
moves any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Batch = Any  # a tensor, or a tuple / list / dict of them (and other values, left as they are)
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


@dataclass(frozen=True)
class ModelSpec:
    """What the toolkit needs of a model. Only `build` is required."""

    name: str
    build: Callable[[Any], nn.Module]  # its own config -> the module (on CPU, or meta)
    # The modules FSDP2 shards one by one, in forward order; activation checkpointing and
    # compile wrap each. Default: the children of the model's largest list of like modules.
    units: Callable[[nn.Module], list[nn.Module]] | None = None
    # (Re)initialise every parameter and buffer in place: after `to_empty` under
    # parallel.meta_init, and (seeded) before sharding otherwise. Default: every submodule's
    # reset_parameters(), which is what torch's own layers initialise with.
    init: Callable[[nn.Module], None] | None = None
    loss: LossFn | None = None  # the micro-batch's loss; default: pair_loss
    # (model, batch) -> (predictions, targets) for an eval metric (e.g. rank IC); optional.
    predict: Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]] | None = None
    # Shards the built model over the "tp" mesh dim in place (before FSDP2); None: no tp.
    tensor_parallel: Callable[[nn.Module, Any], nn.Module] | None = None
    pipeline: bool = False  # splits into stages by layers (toolkit.train.models.stages)
    # Analytic model FLOPs per sample (config, sequence length) -> FLOPs; None: counted by
    # running the model once on meta tensors (toolkit.perfmodel.counted).
    flops_per_sample: Callable[[Any, int], float] | None = None
    # With analytic FLOPs: the activations saved for backward per sample (config, sequence
    # length) -> bytes in fp32; None: left out of the memory estimate (a floor).
    saved_bytes_per_sample: Callable[[Any, int], float] | None = None
    unit: str = "samples"  # throughput unit: tokens (a sample is seq_len tokens) | samples
    config: type | None = None  # a registered model's own config class (entry points)

    def units_of(self, model: nn.Module) -> list[nn.Module]:
        return (self.units or repeated_children)(model)

    def initialise(self, model: nn.Module) -> None:
        (self.init or reset_all)(model)

    def loss_of(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return (self.loss or pair_loss)(model, batch)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Every tensor in `batch` on `device` (non-blocking: pinned host memory overlaps)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    return batch


def batch_size(batch: Batch) -> int:
    """Samples in a micro-batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        values = list(batch.values())
    elif isinstance(batch, list | tuple):
        values = list(batch)
    else:
        values = []
    for value in values:
        try:
            return batch_size(value)
        except TypeError:
            continue
    raise TypeError(f"a micro-batch of {type(batch).__name__} holds no tensor")


def pair_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The built-in convention: an (inputs, targets) pair and `forward(inputs, targets)`
    returning the loss."""
    inputs, targets = batch
    return model(inputs, targets)


def repeated_children(model: nn.Module) -> list[nn.Module]:
    """The children of the model's largest nn.ModuleList / nn.ModuleDict whose members are all
    of one class (a transformer's layers, an LSTM stack's cells); [] when it has none (then
    the whole model is one FSDP2 unit)."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList | nn.ModuleDict):
            children = list(module.children())
            like = len({type(c) for c in children}) == 1
            if like and len(children) > len(best):
                best = children
    return best


def modules_of_classes(model: nn.Module, classes: tuple[type, ...]) -> list[nn.Module]:
    """Every submodule of one of `classes` that is not inside another such module."""
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside or module is model:
            continue
        if isinstance(module, classes):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


def reset_all(model: nn.Module) -> None:
    """Every submodule's own reset_parameters() (torch's layers define it)."""
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
