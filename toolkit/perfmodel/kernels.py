"""Time of one rank's kernels, term by term (pure arithmetic).

* GEMMs at the achievable rate of their own shape (`HardwareConfig.matmul_fraction`);
* causal attention (SDPA) at the attention table's rate, counting the FLOPs it executes
  (about half of full attention: the masked half of the score matrix is skipped);
* the non-GEMM kernels (LayerNorm, GELU, residual adds, layout copies, embedding, the loss)
  charged by the bytes they move at `memory_bandwidth * elementwise_fraction`;
* the optimizer and gradient clipping by the bytes the foreach kernels move;
* a fixed cost per launched op (`op_overhead_s`: kernel launch on GPU, eager dispatch and
  autograd bookkeeping on CPU) times the ops a step launches.

The counts below are read off the model code (toolkit/train/models/blocks.py, gpt.py) and
torch's foreach AdamW; docs/perfmodel.md writes each one out.
"""

from __future__ import annotations

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import ModelConfig

FP32 = 4
# Non-GEMM bytes of one block's forward, in units of tokens*dim*bytes (r = mlp_ratio):
# LayerNorm x2 (read+write: 4), residual adds x2 (2 reads + 1 write: 6), the attention
# output's transpose+reshape copy (2), GELU (read+write r wide: 2r).
BLOCK_FORWARD_UNITS_BASE = 12.0
BLOCK_FORWARD_UNITS_PER_RATIO = 2.0
BACKWARD_BYTES_FACTOR = 2.0  # each elementwise backward reads input and grad, writes a grad
# Ops launched by one block's forward: 2 norms, 4 linears, split, 3 views, 3 transposes,
# SDPA, transpose, reshape, GELU, 2 adds = 19; backward launches about twice as many.
BLOCK_FORWARD_OPS = 19
BACKWARD_OPS_FACTOR = 2.0
# Root forward: arange, 2 lookups, add, final norm, head, float, 2 flattens, log_softmax, nll.
ROOT_FORWARD_OPS = 11
# Foreach AdamW (torch.optim.adam._multi_tensor_adam, not capturable), fp32 words moved per
# parameter: weight-decay mul_ 2, lerp_ 3, mul_ 2, addcmul_ 3, sqrt 2, div_ 2, add_ 2,
# div_ 2, addcdiv_ 4 = 22; clipping: foreach norm 1 + foreach mul_ 2 = 3.
ADAMW_WORDS_PER_PARAM = 22
CLIP_WORDS_PER_PARAM = 3
OPTIMIZER_FOREACH_OPS = 10 + 3  # the foreach calls of AdamW + clipping
TENSORS_PER_BLOCK = 8  # norm1 w/b, qkv, proj, norm2 w/b, fc, proj
ROOT_TENSORS = 5  # token and position embeddings, final norm w/b, head


def gemm_shapes(model: ModelConfig, tokens: int, width: int) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of the forward GEMMs of one micro-step on `tokens` rows: the block's
    four linears (per layer) and the head (`width` outputs)."""
    d = model.dim
    hidden = int(d * model.mlp_ratio)
    block = [
        ("qkv", tokens, 3 * d, d),
        ("attn_proj", tokens, d, d),
        ("fc", tokens, hidden, d),
        ("mlp_proj", tokens, d, hidden),
    ]
    return block * model.num_layers + [("head", tokens, width, d)]


def backward_shapes(m: int, n: int, k: int) -> list[tuple[int, int, int]]:
    """A linear y = x W^T (x: m x k, W: n x k) backward: dx = dy W (m, k, n), dW = dy^T x
    (n, k, m)."""
    return [(m, k, n), (n, k, m)]


def gemm_seconds(m: int, n: int, k: int, dtype: str, hw: HardwareConfig) -> float:
    return 2.0 * m * n * k / (hw.peak_flops(dtype) * hw.matmul_fraction(m, n, k, dtype))


def gemm_time(
    model: ModelConfig,
    tokens: int,
    width: int,
    dtype: str,
    hw: HardwareConfig,
    recompute: bool,
) -> float:
    """Seconds of one micro-step's GEMMs: forward, backward (two GEMMs per forward one) and,
    with activation checkpointing, the blocks' forward again (the head is not recomputed)."""
    total = 0.0
    for name, m, n, k in gemm_shapes(model, tokens, width):
        forward = gemm_seconds(m, n, k, dtype, hw)
        total += forward + sum(gemm_seconds(*s, dtype, hw) for s in backward_shapes(m, n, k))
        if recompute and name != "head":
            total += forward
    return total


def causal_attention_flops(model: ModelConfig, tokens: int, seq_len: int) -> float:
    """Executed FLOPs of causal SDPA over one micro-step, forward + backward: full attention
    is 12*L*d*S per token (QK^T and AV: 4*L*d*S forward, twice that backward); causal
    executes about half."""
    return 0.5 * 12.0 * model.num_layers * model.dim * seq_len * tokens


def attention_time(
    model: ModelConfig, tokens: int, seq_len: int, dtype: str, hw: HardwareConfig, recompute: bool
) -> float:
    executed = causal_attention_flops(model, tokens, seq_len) * (4.0 / 3.0 if recompute else 1.0)
    head_dim = model.dim // model.num_heads
    return executed / (hw.peak_flops(dtype) * hw.attention_fraction(seq_len, head_dim, dtype))


def cross_entropy_bytes_per_logit(act_bytes: int) -> float:
    """.float() cast (read a, write 4; nothing in fp32), log_softmax (read 4, write 4), its
    backward (read grad and output, write 4 each), the cast back (read 4, write a)."""
    cast = 0.0 if act_bytes == FP32 else 2.0 * (act_bytes + FP32)
    return cast + 2 * FP32 + 3 * FP32


def elementwise_bytes(
    model: ModelConfig, tokens: int, width: int, act_bytes: int, recompute: bool
) -> float:
    """Bytes the non-GEMM kernels of one micro-step move."""
    unit = tokens * model.dim * act_bytes
    forward = BLOCK_FORWARD_UNITS_BASE + BLOCK_FORWARD_UNITS_PER_RATIO * model.mlp_ratio
    per_block = forward * (1 + BACKWARD_BYTES_FACTOR + (1 if recompute else 0))
    # Embedding: 2 lookups + add (5 units) forward; backward zero-fills the (vocab x dim)
    # gradient and adds the token rows into it. Final norm: 2 units forward, 4 backward.
    embedding = 5 * unit + 2 * width * model.dim * act_bytes + 2 * unit
    final_norm = 6 * unit
    loss = tokens * width * cross_entropy_bytes_per_logit(act_bytes)
    return model.num_layers * per_block * unit + embedding + final_norm + loss


def ops_per_micro_step(model: ModelConfig, recompute: bool) -> float:
    block = BLOCK_FORWARD_OPS * (1 + BACKWARD_OPS_FACTOR + (1 if recompute else 0))
    return model.num_layers * block + ROOT_FORWARD_OPS * (1 + BACKWARD_OPS_FACTOR)


def optimizer_bytes(local_params: float) -> float:
    """Bytes foreach AdamW and clipping move over this rank's fp32 shard."""
    return (ADAMW_WORDS_PER_PARAM + CLIP_WORDS_PER_PARAM) * FP32 * local_params


def optimizer_ops(model: ModelConfig) -> float:
    """Foreach kernels run one launch per tensor where no fused multi-tensor kernel exists
    (CPU); on GPU one launch covers many tensors, so this is an upper bound there."""
    return OPTIMIZER_FOREACH_OPS * (TENSORS_PER_BLOCK * model.num_layers + ROOT_TENSORS)


def rank_speed(hw: HardwareConfig, ranks_per_node: int) -> float:
    """How much faster (or slower) than one profiled device a rank computes. GPU: 1. CPU:
    the ranks of a node share `cores_per_node` cores; a rank with several threads (the
    toolkit gives it cores // ranks) gains threads x the measured thread efficiency, ranks
    beyond the cores share them."""
    if hw.cores_per_node <= 0:
        return 1.0
    threads = hw.cores_per_node // ranks_per_node
    if threads > 1:
        return threads * hw.thread_efficiency
    return min(1.0, hw.cores_per_node / ranks_per_node)


def overhead_slowdown(hw: HardwareConfig, ranks_per_node: int) -> float:
    """Op dispatch is one thread's work: it slows when ranks outnumber cores, never speeds
    up; a rank with several threads pays the measured threaded per-op cost instead."""
    if hw.cores_per_node <= 0:
        return 1.0
    if hw.cores_per_node // ranks_per_node > 1:
        return hw.threaded_op_overhead_s / hw.op_overhead_s if hw.op_overhead_s > 0 else 1.0
    return max(1.0, ranks_per_node / hw.cores_per_node)
