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


# The styles of a published plan (transformers' `base_model_tp_plan`: module pattern ->
# style name) that torch's public ParallelStyle classes express. Others (packed, local,
# grouped-GEMM styles of some MoE models) are refused by name.
PUBLISHED_STYLES: dict[str, Callable[[], object]] = {
    "colwise": ColwiseParallel,  # weight rows split; output sharded on the last dim, local
    "rowwise": RowwiseParallel,  # weight columns split; its output all-reduced (replicated)
}


def published_plan_problems(plan: dict[str, str] | None) -> list[str]:
    """What keeps a published plan from being applied with torch's ParallelStyles: no plan,
    or a style this toolkit cannot express (one line each)."""
    if not plan:
        return ["publishes no tensor-parallel plan (base_model_tp_plan)"]
    return [
        f"its plan's style {style!r} for {pattern} has no torch ParallelStyle here "
        f"(supported: {', '.join(PUBLISHED_STYLES)})"
        for pattern, style in plan.items()
        if style not in PUBLISHED_STYLES
    ]


def apply_published_plan(module: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, str]) -> None:
    """Shard `module` in place by a published plan whose keys are module paths relative to
    it (`layers.*.self_attn.q_proj`, `*` for any one name) and whose values name a style:
    Megatron's pairs, a column-wise projection whose local output feeds a row-wise one
    whose output is all-reduced, so every module between keeps working on plain local
    tensors (the attention sees its rank's heads). The rest of the model (embeddings,
    norms, head) stays replicated on every tp rank."""
    parallelize_module(
        module, tp_mesh, {pattern: PUBLISHED_STYLES[style]() for pattern, style in plan.items()}
    )


def loss_context(tp: int) -> Callable[[], AbstractContextManager]:
    """The context the loss's forward and backward run in: loss_parallel() under tensor
    parallelism (cross-entropy over vocabulary-sharded logits), else nothing."""
    return loss_parallel if tp > 1 else contextlib.nullcontext
