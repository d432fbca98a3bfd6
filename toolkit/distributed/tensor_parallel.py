"""Tensor parallelism (Megatron-style, with sequence parallelism) on the mesh's "tp" dim.

Inside a block the attention's fused head-major qkv projection and the MLP's first linear
are split column-wise (each tp rank owns whole heads / a slice of the MLP width), the
output projections row-wise. Between the sublayers the residual stream is sharded along the
sequence (Shard(1)): the LayerNorms run on a tp rank's share of the tokens (sequence
parallelism), and each sublayer starts with an all-gather of its input and ends with a
reduce-scatter of its output instead of an all-reduce. The token embedding is split by
vocabulary rows and hands out sequence shards; the position embedding likewise by positions
(its 1-D lookup is sharded along the positions, matching the tokens' sequence shards). The
vocabulary projection is column-wise with its logits left sharded over the vocabulary
(Shard(-1)): the cross-entropy then runs under `loss_parallel()`, never gathering the
logits. The model has no dropout, so there is no dropout region to place.

FSDP2 is applied afterwards over the data-parallel dims (toolkit.distributed.fsdp): every
parameter becomes a DTensor over (dp..., tp). Checkpoints keep logical (unsharded) keys and
shapes, so they load under any layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)


def block_plan() -> dict[str, object]:
    """The plan for one toolkit.train.models.blocks.Block: its input and output are
    sequence-sharded local tensors [batch, seq / tp, dim]."""

    def gather() -> PrepareModuleInput:  # a sublayer's input: all-gather the sequence
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    return {
        "norm1": SequenceParallel(),
        "attn": gather(),
        "attn.qkv_heads": ColwiseParallel(),  # whole heads per rank (head-major rows)
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatter
        "norm2": SequenceParallel(),
        "mlp": gather(),
        "mlp.fc": ColwiseParallel(),
        "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def gpt_plan() -> dict[str, object]:
    """Embeddings, final norm and head of toolkit.train.models.gpt.GPT."""
    return {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        # positions are 1-D [seq]: Shard(0) of the lookup is the tokens' Shard(1)
        "pos_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        ),
    }


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard the GPT `model` (built, on CPU or meta, not yet FSDP-wrapped) over `tp_mesh` in
    place (the GPT spec's tensor_parallel, toolkit.train.models.builtin).

    Parts a pipeline stage does not hold (None) are skipped."""
    top = {
        name: style for name, style in gpt_plan().items() if getattr(model, name, None) is not None
    }
    parallelize_module(model, tp_mesh, top)
    blocks = model.blocks
    for block in blocks.values() if isinstance(blocks, nn.ModuleDict) else blocks:
        parallelize_module(block, tp_mesh, block_plan())
    return model


def loss_context(tp: int) -> Callable[[], AbstractContextManager]:
    """The context the loss's forward and backward run in: loss_parallel() under tensor
    parallelism (cross-entropy over vocabulary-sharded logits), else nothing."""
    return loss_parallel if tp > 1 else contextlib.nullcontext
