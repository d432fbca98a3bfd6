"""FSDP2 wrapping: per-block fully_shard over the data-parallel mesh, mixed precision, AC and
compile (the mesh itself: toolkit.distributed.mesh)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from toolkit.config.parallel import ParallelConfig
from toolkit.config.precision import PrecisionConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mixed_precision(cfg: PrecisionConfig) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype]
    )


def parallelize(
    model: nn.Module, mesh: DeviceMesh, parallel: ParallelConfig, precision: PrecisionConfig
) -> FSDPModule:
    """Shard each transformer block, then the root (embeddings, final norm, head).

    Order matters: activation checkpointing and compile wrap the block's compute before
    fully_shard registers its hooks, so all-gathers stay outside the compiled region.
    """
    mp = mixed_precision(precision)
    blocks = list(model.blocks.values())  # type: ignore[union-attr]  # ModuleDict by layer
    for i, block in enumerate(blocks):
        block.activation_checkpointing = parallel.activation_checkpointing
        if parallel.compile:
            block.compile()
        # The last block's parameters are needed again at the start of backward: keep them.
        reshard = parallel.reshard_after_forward and i < len(blocks) - 1
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(
        model, mesh=mesh, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward
    )
    return model  # type: ignore[return-value]


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank holds (its shards)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global grad norm over sharded (DTensor) gradients, clipping when max_norm > 0.

    The norm of sharded grads is a DTensor with a pending reduction; full_tensor() performs
    that one all-reduce, so every rank sees the same global norm."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(
            [p for p in model.parameters() if p.grad is not None], max_norm, total, foreach=True
        )
    return total
