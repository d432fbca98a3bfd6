"""Tensor parallelism with sequence parallelism, as torch.distributed.tensor.parallel runs
it (Megatron-LM's layout: Shoeybi et al. 2019, sequence parallelism: Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198).

Per block, qkv and fc are column-parallel (outputs split over tp ranks), the two projections
row-parallel (inputs split); norms, residual adds and dropout run on a sequence shard. So a
block's forward all-gathers the sequence before attention and before the MLP and
reduce-scatters after each (4 collectives); backward mirrors them (a reduce-scatter for each
all-gather, an all-gather for each reduce-scatter: 4 more); activation checkpointing re-runs
the forward's 4. The embedding is row-parallel over the vocabulary (a reduce-scatter forward,
an all-gather backward); the head is vocabulary-parallel (an all-gather forward, a
reduce-scatter backward) with loss parallel (two all-reduces of one fp32 per token: the max
and the sum of exponentials).

Every all-gather or reduce-scatter moves micro_batch x seq x dim x activation bytes x
(tp-1)/tp per rank, each timed by toolkit.perfmodel.comm.collective_time over the tp group
(NVLink inside a node). They sit between dependent GEMMs, so they are on the critical path:
no overlap is modelled (Korthikanti et al. and torch's TP overlap none of them by default;
the toolkit has no async-TP option).
"""

from __future__ import annotations

from toolkit.config.model import TransformerConfig
from toolkit.perfmodel.comm import Span, calls_time, ring_fraction
from toolkit.train.flops import block_params, param_counts

BLOCK_COLLECTIVES_FORWARD = 4  # all-gather + reduce-scatter around attention and MLP
LOSS_PARALLEL_ALLREDUCES = 2  # max and sum of exponentials over the vocabulary shards
FP32 = 4


def block_norm_params(model: TransformerConfig) -> int:
    """LayerNorm weights and biases of one block: replicated over tp ranks."""
    return 4 * model.dim


def local_params(model: TransformerConfig, tp: int) -> dict[str, float]:
    """Parameters on one of `tp` ranks, by part (before FSDP shards them): matmul weights
    and the token embedding split tp ways; norms and the position embedding replicated."""
    counts = param_counts(model)
    d = model.dim
    block = block_params(d, model.mlp_ratio)
    norms = block_norm_params(model)
    block_local = (block - norms) / tp + norms
    final_norm = 2 * d
    positions = model.max_seq_len * d
    embedding = (counts["embedding"] - positions) / tp + positions
    head = (counts["head"] - final_norm) / tp + final_norm
    return {
        "embedding": embedding,
        "block": block_local,
        "head": head,
        "total": embedding + model.num_layers * block_local + head,
    }


def block_activation_units(mlp_ratio: float, tp: int) -> float:
    """Tensors one block saves for backward, in micro_batch x seq x dim elements, per rank.

    Without tp: 9 + 2r (model.memory's list). With sequence parallelism the norm inputs,
    q/k/v, the attention output and its copy, fc and GELU outputs are split tp ways
    (7 + 2r units), but torch saves each column-parallel linear's all-gathered input (the
    two norm outputs) whole: 2 units. (Megatron-LM re-gathers them in backward instead and
    keeps 1/tp of everything; torch's DTensor autograd does not.)"""
    if tp == 1:
        return 9.0 + 2.0 * mlp_ratio
    return 2.0 + (7.0 + 2.0 * mlp_ratio) / tp


def collectives(
    model: TransformerConfig,
    *,
    blocks: int,
    embedding: bool,
    head: bool,
    tokens: int,
    act_bytes: int,
    tp: int,
    recompute: bool,
) -> dict[str, float]:
    """Tensor-parallel calls and bytes one rank receives in one micro-step of a stage with
    `blocks` blocks (and the embedding / head when it holds them)."""
    if tp == 1:
        return {"calls": 0, "bytes": 0.0, "allreduce_calls": 0, "allreduce_bytes": 0.0}
    per_block = BLOCK_COLLECTIVES_FORWARD * (2 + (1 if recompute else 0))
    calls = blocks * per_block + 2 * int(embedding) + 2 * int(head)
    per_call = tokens * model.dim * act_bytes * ring_fraction(tp)
    allreduce_calls = LOSS_PARALLEL_ALLREDUCES if head else 0
    return {
        "calls": calls,
        "bytes": calls * per_call,
        "allreduce_calls": allreduce_calls,
        "allreduce_bytes": allreduce_calls * 2.0 * ring_fraction(tp) * tokens * FP32,
    }


def collectives_s(c: dict[str, float], span: Span) -> float:
    """Seconds of a micro-step's tensor-parallel collectives over the tp group's span, all
    on the critical path (the toolkit has no async TP: nothing overlaps them)."""
    half = c["calls"] / 2  # all-gathers and reduce-scatters come in pairs of equal buffers
    gathers = calls_time("all_gather", c["bytes"] / 2, half, span)
    scatters = calls_time("reduce_scatter", c["bytes"] / 2, half, span)
    loss = calls_time("all_reduce", c["allreduce_bytes"], c["allreduce_calls"], span)
    return gathers + scatters + loss
