"""Time of one rank's kernels, term by term (pure arithmetic).

* GEMMs at the achievable rate of their own shape (`HardwareConfig.matmul_fraction`); on a
  GPU preset (`num_sms > 0`) the table holds large-GEMM ceilings and the shape's own rate
  follows from tile and wave quantization and the memory bound (`gemm_seconds`);
* causal attention (SDPA) at the attention table's rate for its sequence length, head dim
  and masking, counting the FLOPs it executes (about half of full attention: the masked half
  of the score matrix is skipped);
* the non-GEMM kernels (LayerNorm, GELU, residual adds, layout copies, embedding, the loss)
  charged by the bytes they move at `memory_bandwidth * elementwise_fraction`;
* the optimizer and gradient clipping by the bytes the foreach kernels move;
* a fixed cost per launched op (`op_overhead_s`: kernel launch on GPU, eager dispatch and
  autograd bookkeeping on CPU) times the ops a step launches.

The counts below are read off the model code (toolkit/train/models/blocks.py, gpt.py) and
torch's foreach AdamW; docs/perfmodel.md writes each one out.
"""

from __future__ import annotations

import math

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import TransformerConfig
from toolkit.perfmodel.comm import DTYPE_BYTES

FP32 = 4
# Output tiles (rows x columns of C) of cuBLAS's larger GEMM kernels: NVIDIA, "Matrix
# Multiplication Background User's Guide" (DU-09799-001), sections 2.3 and 3. One tile per SM
# at a time; the last wave of tiles may leave SMs idle (wave quantization) and a partial
# tile computes padding (tile quantization). The heuristic picks the tile that fills best.
GEMM_TILES = ((256, 128), (128, 256), (128, 128))
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
# Root forward: arange, 2 lookups, add (embedding: 4); final norm, head, float, 2 flattens,
# log_softmax, nll (head and loss: 7).
EMBEDDING_FORWARD_OPS = 4
HEAD_FORWARD_OPS = 7
# Foreach AdamW (torch.optim.adam._multi_tensor_adam, not capturable), fp32 words moved per
# parameter: weight-decay mul_ 2, lerp_ 3, mul_ 2, addcmul_ 3, sqrt 2, div_ 2, add_ 2,
# div_ 2, addcdiv_ 4 = 22; clipping: foreach norm 1 + foreach mul_ 2 = 3.
ADAMW_WORDS_PER_PARAM = 22
CLIP_WORDS_PER_PARAM = 3
OPTIMIZER_FOREACH_OPS = 10 + 3  # the foreach calls of AdamW + clipping
# optim.fused on CUDA: torch._fused_adamw_ is one multi-tensor kernel that reads param, grad,
# exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq (7 words per parameter); the
# clipping's foreach norm and mul stay.
FUSED_OPTIMIZER_OPS = 1 + 3
FUSED_ADAMW_WORDS_PER_PARAM = 7
TENSORS_PER_BLOCK = 8  # norm1 w/b, qkv, proj, norm2 w/b, fc, proj
ROOT_TENSORS = 5  # token and position embeddings, final norm w/b, head


def output_width(model: TransformerConfig) -> int:
    """Outputs of the head: the vocabulary, or the time-series model's targets."""
    return model.outputs


def shard(n: int, tp: int) -> int:
    """One tensor-parallel rank's share of a dimension split over `tp` ranks."""
    return -(-n // tp)


def block_gemm_shapes(
    model: TransformerConfig, tokens: int, tp: int = 1
) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of one block's forward GEMMs on `tokens` rows, on one of `tp` ranks:
    column-parallel qkv and fc split their outputs (n / tp), row-parallel projections their
    inputs (k / tp); the rows are the whole micro-batch (sequence parallelism all-gathers
    them before the column-parallel GEMMs)."""
    d = model.dim
    hidden = int(d * model.mlp_ratio)
    return [
        ("qkv", tokens, shard(3 * d, tp), d),
        ("attn_proj", tokens, d, shard(d, tp)),
        ("fc", tokens, shard(hidden, tp), d),
        ("mlp_proj", tokens, d, shard(hidden, tp)),
    ]


def gemm_shapes(
    model: TransformerConfig, tokens: int, width: int, tp: int = 1
) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of the forward GEMMs of one micro-step on `tokens` rows: the block's
    four linears (per layer) and the head (`width` outputs, vocabulary-parallel under tp)."""
    head = [("head", tokens, shard(width, tp), model.dim)]
    return block_gemm_shapes(model, tokens, tp) * model.num_layers + head


def backward_shapes(m: int, n: int, k: int) -> list[tuple[int, int, int]]:
    """A linear y = x W^T (x: m x k, W: n x k) backward: dx = dy W (m, k, n), dW = dy^T x
    (n, k, m)."""
    return [(m, k, n), (n, k, m)]


def wave_efficiency(m: int, n: int, num_sms: int) -> float:
    """Share of the SMs' tile slots an (m x n) output fills, for the best of `GEMM_TILES`:
    useful m*n over waves x SMs x tile area (tile and wave quantization)."""

    def filled(tile: tuple[int, int]) -> float:
        tiles = shard(m, tile[0]) * shard(n, tile[1])
        waves = shard(tiles, num_sms)
        return m * n / (waves * num_sms * tile[0] * tile[1])

    return max(filled(t) for t in GEMM_TILES)


def gemm_bytes(m: int, n: int, k: int, dtype: str) -> float:
    """Bytes a GEMM must move at least: read A (m x k) and B (k x n), write C (m x n)."""
    return (m * k + k * n + m * n) * DTYPE_BYTES[dtype]


def gemm_seconds(m: int, n: int, k: int, dtype: str, hw: HardwareConfig) -> float:
    """2mnk FLOPs at the table's fraction of the peak. With `num_sms` (GPU presets) the table
    is the large-GEMM ceiling, scaled by the shape's wave efficiency, and the GEMM takes at
    least its bytes' time at memory bandwidth (the roofline)."""
    rate = hw.peak_flops(dtype) * hw.matmul_fraction(m, n, k, dtype)
    if hw.num_sms <= 0:
        return 2.0 * m * n * k / rate
    compute = 2.0 * m * n * k / (rate * wave_efficiency(m, n, hw.num_sms))
    return max(compute, gemm_bytes(m, n, k, dtype) / hw.memory_bandwidth)


def forward_backward_gemm_s(m: int, n: int, k: int, dtype: str, hw: HardwareConfig) -> float:
    forward = gemm_seconds(m, n, k, dtype, hw)
    return forward + sum(gemm_seconds(*s, dtype, hw) for s in backward_shapes(m, n, k))


def block_gemm_s(
    model: TransformerConfig,
    tokens: int,
    dtype: str,
    hw: HardwareConfig,
    recompute: bool,
    tp: int = 1,
) -> float:
    """Seconds of one block's GEMMs for one micro-step: forward, backward (two GEMMs per
    forward one) and, with activation checkpointing, the forward again."""
    total = 0.0
    for _, m, n, k in block_gemm_shapes(model, tokens, tp):
        total += forward_backward_gemm_s(m, n, k, dtype, hw)
        if recompute:
            total += gemm_seconds(m, n, k, dtype, hw)
    return total


def head_gemm_s(
    model: TransformerConfig, tokens: int, width: int, dtype: str, hw: HardwareConfig, tp: int = 1
) -> float:
    """The head's GEMMs for one micro-step (never recomputed)."""
    return forward_backward_gemm_s(tokens, shard(width, tp), model.dim, dtype, hw)


def causal_attention_flops(model: TransformerConfig, tokens: int, seq_len: int) -> float:
    """Executed FLOPs of causal SDPA over one micro-step, forward + backward: full attention
    is 12*L*d*S per token (QK^T and AV: 4*L*d*S forward, twice that backward); causal
    executes about half."""
    return 0.5 * 12.0 * model.num_layers * model.dim * seq_len * tokens


def block_attention_s(
    model: TransformerConfig,
    tokens: int,
    seq_len: int,
    dtype: str,
    hw: HardwareConfig,
    recompute: bool,
    tp: int = 1,
) -> float:
    """One block's causal SDPA for one micro-step on one of `tp` ranks (num_heads / tp
    heads each), at the attention table's causal rate."""
    per_block = causal_attention_flops(model, tokens, seq_len) / model.num_layers / tp
    executed = per_block * (4.0 / 3.0 if recompute else 1.0)
    head_dim = model.dim // model.num_heads
    return executed / (
        hw.peak_flops(dtype) * hw.attention_fraction(seq_len, head_dim, dtype, causal=True)
    )


def cross_entropy_bytes_per_logit(act_bytes: int) -> float:
    """.float() cast (read a, write 4; nothing in fp32), log_softmax (read 4, write 4), its
    backward (read grad and output, write 4 each), the cast back (read 4, write a)."""
    cast = 0.0 if act_bytes == FP32 else 2.0 * (act_bytes + FP32)
    return cast + 2 * FP32 + 3 * FP32


# Under tensor parallelism with sequence parallelism every non-GEMM kernel works on a shard:
# LayerNorms, residual adds and the embedding's add on tokens / tp rows, the attention
# output's copy and GELU on heads / tp and hidden / tp, the loss on vocabulary / tp logits,
# the embedding's dense gradient on vocabulary / tp rows. So their bytes divide by tp.
def block_elementwise_bytes(
    model: TransformerConfig, tokens: int, act_bytes: int, recompute: bool, tp: int = 1
) -> float:
    """Bytes one block's non-GEMM kernels move in one micro-step."""
    unit = tokens * model.dim * act_bytes
    forward = BLOCK_FORWARD_UNITS_BASE + BLOCK_FORWARD_UNITS_PER_RATIO * model.mlp_ratio
    return forward * (1 + BACKWARD_BYTES_FACTOR + (1 if recompute else 0)) * unit / tp


def embedding_elementwise_bytes(
    model: TransformerConfig, tokens: int, width: int, act_bytes: int, tp: int = 1
) -> float:
    """Embedding: 2 lookups + add (5 units) forward; backward zero-fills the (vocab x dim)
    gradient and adds the token rows into it (2 units)."""
    unit = tokens * model.dim * act_bytes
    return (7 * unit + 2 * width * model.dim * act_bytes) / tp


def head_elementwise_bytes(
    model: TransformerConfig, tokens: int, width: int, act_bytes: int, tp: int = 1
) -> float:
    """Final norm (2 units forward, 4 backward) and the loss over the logits."""
    unit = tokens * model.dim * act_bytes
    return (6 * unit + tokens * width * cross_entropy_bytes_per_logit(act_bytes)) / tp


def block_ops(recompute: bool) -> float:
    return BLOCK_FORWARD_OPS * (1 + BACKWARD_OPS_FACTOR + (1 if recompute else 0))


def optimizer_bytes(local_params: float, fused: bool = False) -> float:
    """Bytes foreach (or fused) AdamW and clipping move over this rank's fp32 shard."""
    words = FUSED_ADAMW_WORDS_PER_PARAM if fused else ADAMW_WORDS_PER_PARAM
    return (words + CLIP_WORDS_PER_PARAM) * FP32 * local_params


def optimizer_ops(model: TransformerConfig) -> float:
    """Foreach kernels run one launch per tensor where no fused multi-tensor kernel exists
    (CPU); on GPU one launch covers many tensors, so this is an upper bound there."""
    return OPTIMIZER_FOREACH_OPS * (TENSORS_PER_BLOCK * model.num_layers + ROOT_TENSORS)


# torch's multi-tensor apply on CUDA (aten/src/ATen/native/cuda/MultiTensorApply.cuh, CUDA 12
# builds): one kernel launch takes at most depth_to_max_tensors = {110, 64, 48, 36, 30}
# tensors for lists of depth 1..5 and 320 blocks of 65536 elements. AdamW's foreach ops
# work on up to 4 lists: 36 tensors per launch.
FOREACH_TENSORS_PER_LAUNCH = 36
FOREACH_ELEMENTS_PER_LAUNCH = 320 * 65536


def optimizer_launches(tensors: int, local_params: float, gpu: bool, fused: bool = False) -> float:
    """Launches of clipping + AdamW per step: on CPU one per foreach op and tensor; on a GPU
    one per op and chunk of tensors (multi-tensor apply), at least one per op; fused AdamW
    is one op instead of ten."""
    ops = FUSED_OPTIMIZER_OPS if fused else OPTIMIZER_FOREACH_OPS
    if not gpu:
        return ops * tensors
    chunks = max(
        math.ceil(tensors / FOREACH_TENSORS_PER_LAUNCH),
        math.ceil(local_params / FOREACH_ELEMENTS_PER_LAUNCH),
        1,
    )
    return ops * chunks


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
