"""FSDP2 wrapping: per-block fully_shard over the data-parallel mesh, mixed precision, AC and
compile (the mesh itself: toolkit.distributed.mesh)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from toolkit.config.parallel import ParallelConfig
from toolkit.config.precision import PrecisionConfig
from toolkit.distributed.commtime import CommTimer
from toolkit.distributed.step_overhead import compile_mode

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mixed_precision(cfg: PrecisionConfig) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype]
    )


def parallelize(
    model: nn.Module,
    mesh: DeviceMesh,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    units: list[nn.Module] | None = None,
) -> FSDPModule:
    """Shard each unit (the model spec's: a transformer's blocks, by default `model.blocks`),
    then the root (what is left: embeddings, final norm, head).

    Order matters: activation checkpointing and compile wrap the unit's compute before
    fully_shard registers its hooks, so all-gathers stay outside the compiled region.
    """
    mp = mixed_precision(precision)
    if units is None:
        units = list(model.blocks.values())  # type: ignore[union-attr]  # ModuleDict by layer
    for i, unit in enumerate(units):
        if parallel.activation_checkpointing:
            checkpoint_activations(unit)
        if parallel.compile:  # CUDA graphs: reduce-overhead (toolkit.distributed.step_overhead)
            unit.compile(mode=compile_mode(parallel, mesh.device_type))
        # The last unit's parameters are needed again at the start of backward: keep them.
        reshard = parallel.reshard_after_forward and i < len(units) - 1
        fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(
        model, mesh=mesh, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward
    )
    return model  # type: ignore[return-value]


def checkpoint_activations(unit: nn.Module) -> None:
    """Recompute `unit`'s forward in backward: its own switch where it has one (the built-in
    blocks), else its forward wrapped in torch.utils.checkpoint (non-reentrant)."""
    if hasattr(unit, "activation_checkpointing"):
        unit.activation_checkpointing = True
        return
    forward = unit.forward

    @functools.wraps(forward)
    def recomputed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    unit.forward = recomputed  # type: ignore[method-assign]


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank holds (its shards)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def clip_grad_norm_(
    model: nn.Module,
    max_norm: float,
    timer: CommTimer | None = None,
    pp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Global grad norm over sharded (DTensor) gradients, clipping when max_norm > 0.

    Gradients are grouped by the mesh they live on (FSDP's dp mesh, a 2D (dp, tp) mesh, or
    none for plain tensors): within a group the norm of sharded grads is a DTensor with a
    pending reduction, and full_tensor() performs it (one all-reduce per group), so every
    rank sees the same global norm. Groups combine as the root of summed squares, so
    parameters on different meshes never meet in one DTensor op. full_tensor() is a
    functional collective, which the timer's wrappers of torch.distributed do not see: it is
    timed here as all-reduce. With `pp_group` (pipeline parallelism: `model` holds this
    rank's stages only), the squared norms of every stage are summed over that group."""
    groups: dict[object, list[torch.Tensor]] = {}  # mesh (None: plain) -> parameters
    for p in model.parameters():
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    if not groups:
        return torch.zeros(())
    norms = []
    for group in groups.values():
        grads = [p.grad for p in group]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
        if hasattr(norm, "full_tensor"):
            with timer.span("all_reduce") if timer is not None else contextlib.nullcontext():
                norm = norm.full_tensor()
        norms.append(norm)
    if len(norms) == 1 and pp_group is None:
        total = norms[0]
    else:  # several meshes and/or stages: root of the summed squares
        squared = torch.stack([n.double() ** 2 for n in norms]).sum()
        if pp_group is not None:
            dist.all_reduce(squared, group=pp_group)
        total = squared.sqrt().to(norms[0].dtype)
    if max_norm > 0:
        for group in groups.values():  # one foreach call per mesh
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total
