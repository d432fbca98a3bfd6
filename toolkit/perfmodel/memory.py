"""Memory per rank under FSDP2/HSDP, tensor and pipeline parallelism (pure arithmetic).

Each pipeline rank holds its own blocks (and the embedding on the first, the head on the
last); tensor parallelism splits the matmul weights and, with sequence parallelism, most
saved activations tp ways; FSDP2 then shards what a rank holds over dp_shard. The peak of the
layout is the peak of its most loaded pipeline rank.
"""

from __future__ import annotations

from typing import Any

from toolkit.config.model import TransformerConfig
from toolkit.perfmodel import pipeline, tp
from toolkit.perfmodel.comm import DTYPE_BYTES
from toolkit.perfmodel.kernels import output_width
from toolkit.perfmodel.layout import Layout
from toolkit.perfmodel.memory_options import (
    fused_cross_entropy,
    fused_loss_bytes,
    optimizer_state_bytes_per_param,
)

FP32 = 4
CE_BYTES_PER_LOGIT = 12  # fp32 log-softmax output + its gradient + the input gradient


def block_activation_units(mlp_ratio: float) -> float:
    """Tensors one block saves for backward, in batch*seq*dim elements of the compute dtype:

    norm1 input 1, norm1 output 1, q/k/v 3, attention output 1, its contiguous copy (proj
    input) 1, norm2 input 1, norm2 output 1, fc output r, GELU output r  ->  9 + 2r (17 at r=4).
    Flash/efficient attention keeps no seq x seq matrix; LayerNorm statistics are negligible."""
    return tp.block_activation_units(mlp_ratio, 1)


def accumulated_grads_bytes(total: float, layout: Layout) -> float:
    """Gradient bytes a rank carries from one micro-step into the next (grad_accum > 1):
    with grad_sync=last FSDP2 keeps every unit's unsharded gradient, in reduce_dtype, from
    the first micro-step until the last reduces it (the whole model's gradient on every
    rank); with grad_sync=every each micro-step reduce-scatters, and what accumulates is the
    fp32 sharded gradient (1/dp_shard of it)."""
    if layout.grad_accum == 1:
        return 0.0
    if layout.keeps_unsharded_grads:
        return total * DTYPE_BYTES[layout.reduce_dtype]
    return total * FP32 / layout.shard_size


def stage_memory(
    model: TransformerConfig, layout: Layout, stage: pipeline.Stage, capacity_bytes: float
) -> dict[str, Any]:
    """Bytes on one rank of pipeline rank `stage`. Sharded state is fp32 (the model is built
    in fp32; FSDP2 keeps the sharded parameters in their original dtype and casts to
    param_dtype for compute)."""
    p_bytes = DTYPE_BYTES[layout.param_dtype]
    r_bytes = DTYPE_BYTES[layout.reduce_dtype]
    local = tp.local_params(model, layout.tp)
    block = local["block"]
    root = local["embedding"] * stage.embedding + local["head"] * stage.head
    total = root + stage.blocks * block
    shard = layout.shard_size

    params = total * FP32 / shard
    grads = total * FP32 / shard
    # Optimizer states, sharded like the parameters: bytes per parameter by optimizer name
    # (memory_options.OPTIMIZER_STATE_BYTES: 8 for AdamW's two fp32 states).
    optimizer = optimizer_state_bytes_per_param(layout.optimizer) * total / shard
    # Unsharded parameters in compute dtype while computing: the root unit (it spans the whole
    # forward and, as FSDP2's root, is not resharded after forward) plus the current block and
    # the one prefetched. Without reshard_after_forward every block stays gathered until its
    # backward.
    gathered_blocks = 2 if layout.reshard_after_forward else stage.blocks
    allgather = (root + min(gathered_blocks, stage.blocks) * block) * p_bytes
    # Gradient staging: a unit's unsharded gradient in compute dtype plus its reduce_dtype
    # reduce-scatter input (FSDP2 reshards the unit's parameters before reducing).
    block_staging = block * (p_bytes + r_bytes)
    root_staging = root * (p_bytes + r_bytes)

    tokens = layout.micro_batch_size * layout.seq_len  # one micro-step on this rank
    unit = tokens * model.dim * p_bytes
    per_block = tp.block_activation_units(model.mlp_ratio, layout.tp) * unit
    if layout.activation_checkpointing:
        # Only each block's input (a sequence shard under tp) is kept; one block is
        # rematerialised at a time in backward.
        micro_batch = stage.blocks * unit / layout.tp + per_block
    else:
        micro_batch = stage.blocks * per_block
    if stage.head:
        micro_batch += 2 * unit / layout.tp  # final norm input and output (head input)
    m, p, v = layout.grad_accum, layout.pp, layout.virtual_stages
    inflight = pipeline.in_flight(layout.pp_schedule, p, m, v, stage.rank)
    activations = inflight * micro_batch
    logits = 0.0  # the loss's transient working set at the start of backward
    loss_held = 0.0  # what the fused loss keeps from its forward through backward
    if stage.head:
        held = pipeline.logits_in_flight(layout.pp_schedule, m) if p > 1 else 1
        width = output_width(model) / layout.tp
        if fused_cross_entropy(layout.kernels, model.token_inputs):
            fused = fused_loss_bytes(tokens, int(width), model.dim, p_bytes)
            logits = fused["chunk"]
            loss_held = held * fused["held"]
        else:
            logits = held * tokens * width * CE_BYTES_PER_LOGIT

    # Peak candidates (the largest is the peak):
    # - backward, first blocks: saved activations all alive, plus either the loss working
    #   set (just before) or the first block's gradient staging (just after);
    # - end of backward: activations gone, the blocks' sharded gradients and the root unit's
    #   gradient staging (the root is reduced last; the largest unit for big vocabularies);
    # - optimizer step: gradients still alive (zero_grad(set_to_none=True) frees them after
    #   the step); foreach AdamW holds about one parameter-shard-sized temporary.
    # - between micro-steps, with the parameters kept unsharded across them: every unit
    #   gathered at once, the activations freed.
    accumulated = accumulated_grads_bytes(total, layout)
    held_params = total * p_bytes if layout.keeps_params_gathered else 0.0
    backward_peak = (
        params
        + optimizer
        + allgather
        + activations
        + accumulated
        + loss_held
        + max(logits, block_staging)
    )
    block_grads = (total - root) * FP32 / shard
    end_of_backward_peak = params + optimizer + block_grads + root_staging
    optimizer_peak = params + grads + optimizer + params
    between_micro_steps_peak = params + optimizer + accumulated + held_params
    terms = {
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": optimizer,
        "allgather_bytes": allgather,
        "accumulated_grads_bytes": accumulated,
        "held_params_bytes": held_params,
        "activations_bytes": activations,
        "logits_bytes": logits,
        "loss_held_bytes": loss_held,
    }
    peak = max(backward_peak, end_of_backward_peak, optimizer_peak, between_micro_steps_peak)
    return {
        "stage": stage.rank,
        "stage_blocks": stage.blocks,
        "micro_batches_in_flight": inflight,
        "accumulated_grads_bytes": accumulated,
        "held_params_bytes": held_params,
        "grad_sync": layout.grad_sync,
        "capacity_bytes": capacity_bytes,
        "fits": float(peak <= capacity_bytes),
        "largest_term": max(terms, key=lambda k: terms[k]),
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": optimizer,
        "allgather_bytes": allgather,
        "staging_bytes": max(block_staging, root_staging),
        "block_staging_bytes": block_staging,
        "root_staging_bytes": root_staging,
        "activations_bytes": activations,
        "logits_bytes": logits,
        "loss_held_bytes": loss_held,
        "fused_cross_entropy": float(fused_cross_entropy(layout.kernels, model.token_inputs)),
        "optimizer_state_bytes_per_param": optimizer_state_bytes_per_param(layout.optimizer),
        "state_bytes": params + grads + optimizer,
        "backward_peak_bytes": backward_peak,
        "end_of_backward_peak_bytes": end_of_backward_peak,
        "optimizer_peak_bytes": optimizer_peak,
        "between_micro_steps_peak_bytes": between_micro_steps_peak,
        "peak_bytes": peak,
    }


def memory(
    model: TransformerConfig,
    layout: Layout,
    capacity_bytes: float = float("inf"),
    stages: list[pipeline.Stage] | None = None,
) -> dict[str, Any]:
    """Bytes per rank of the most loaded pipeline rank (the only one without pp); the
    peak of every pipeline rank under `stage_peaks_bytes`."""
    stages = pipeline.layout_stages(model, layout) if stages is None else stages
    per_stage = [stage_memory(model, layout, s, capacity_bytes) for s in stages]
    worst = max(per_stage, key=lambda m: m["peak_bytes"])
    return {**worst, "stage_peaks_bytes": [m["peak_bytes"] for m in per_stage]}
