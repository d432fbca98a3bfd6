"""Pipeline parallelism: stages, schedules, bubbles, in-flight activations, point-to-point.

Sources:
* GPipe (Huang et al. 2019, arXiv:1811.06965): m micro-batches through p stages, all
  forwards then all backwards; the idle "bubble" is (p-1)/(m+p-1) of the step, and every
  stage holds the activations of all m micro-batches until their backward.
* 1F1B (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473, section 2.2): the same bubble
  as GPipe, but stage i holds at most p-i micro-batches in flight (p on the first stage).
* Interleaved 1F1B (same paper, section 2.2.2): each rank runs v model chunks; the bubble
  time shrinks by v: (p-1)/v stage-times, i.e. (p-1)/(v*m+p-1) of the step. Rank i holds
  (2(p-i-1) + (v-1)p + 1) chunks in flight (Megatron-LM's warm-up count plus one), which on
  the first rank is p(1 + (p-1)/(p v)) micro-batches of its layers (Korthikanti et al. 2022,
  arXiv:2205.05198, section 4.2.3).

Step time: the slowest stage's time per micro-batch (its compute, its tensor-parallel
collectives and its sends) times m + (p-1)/v. Point-to-point: per micro-batch and stage
boundary the stage's output goes forward and its gradient back, micro_batch x seq x dim x
activation bytes each (split tp ways under sequence parallelism); torch.distributed.pipelining
waits for a stage's input before computing it, so the transfers are not overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import TransformerConfig
from toolkit.perfmodel import kernels
from toolkit.perfmodel.comm import DTYPE_BYTES


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """Idle fraction of a pipeline step: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m+p-1)
    for interleaved 1F1B with v virtual stages per rank (the bubble time divided by v)."""
    if p <= 1:
        return 0.0
    v = v if schedule == "interleaved_1f1b" else 1
    return (p - 1) / (v * m + p - 1)


def pipeline_s(stage_s: float, schedule: str, p: int, m: int, v: int = 1) -> float:
    """Seconds of the pipelined part of a step: m micro-batches plus the bubble, (p-1)/v
    stage-times; equals m * stage_s / (1 - bubble_fraction)."""
    if p <= 1:
        return m * stage_s
    v = v if schedule == "interleaved_1f1b" else 1
    return (m + (p - 1) / v) * stage_s


def in_flight(schedule: str, p: int, m: int, v: int, rank: int) -> float:
    """Micro-batches whose activations pipeline rank `rank` holds at its peak, in units of
    one micro-batch through all of that rank's layers."""
    if p <= 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved_1f1b" and v > 1:
        chunks = 2 * (p - rank - 1) + (v - 1) * p + 1
        return min(float(m), chunks / v)
    return float(min(m, p - rank))


def logits_in_flight(schedule: str, m: int) -> int:
    """Micro-batches whose loss working set the last stage holds: all of them under GPipe
    (every forward runs before the first backward), one under 1F1B."""
    return m if schedule == "gpipe" else 1


def p2p_bytes(micro_batch: int, seq_len: int, dim: int, act_bytes: int, tp: int = 1) -> float:
    """Bytes one rank sends across one stage boundary for one micro-batch in one direction
    (its sequence shard under tensor parallelism)."""
    return micro_batch * seq_len * dim * act_bytes / tp


# -- per-layer cost and stage balance ------------------------------------------------------
def part_seconds(
    model: TransformerConfig,
    tokens: int,
    seq_len: int,
    hw: HardwareConfig,
    dtype: str = "float32",
    tp: int = 1,
    recompute: bool = False,
) -> dict[str, dict[str, float]]:
    """Seconds of one micro-step, forward + backward, on one device, for the embedding, one
    block and the head + loss, split by term (gemm, attention, elementwise, overhead)."""
    width = kernels.output_width(model)
    act = DTYPE_BYTES[dtype]
    bw = hw.memory_bandwidth * hw.elementwise_fraction
    passes = 1 + kernels.BACKWARD_OPS_FACTOR
    block = {
        "gemm": kernels.block_gemm_s(model, tokens, dtype, hw, recompute, tp),
        "attention": kernels.block_attention_s(model, tokens, seq_len, dtype, hw, recompute, tp),
        "elementwise": kernels.block_elementwise_bytes(model, tokens, act, recompute, tp) / bw,
        "overhead": kernels.block_ops(recompute) * hw.op_overhead_s,
    }
    embedding = {
        "gemm": 0.0,
        "attention": 0.0,
        "elementwise": kernels.embedding_elementwise_bytes(model, tokens, width, act, tp) / bw,
        "overhead": kernels.EMBEDDING_FORWARD_OPS * passes * hw.op_overhead_s,
    }
    head = {
        "gemm": kernels.head_gemm_s(model, tokens, width, dtype, hw, tp),
        "attention": 0.0,
        "elementwise": kernels.head_elementwise_bytes(model, tokens, width, act, tp) / bw,
        "overhead": kernels.HEAD_FORWARD_OPS * passes * hw.op_overhead_s,
    }
    return {"embedding": embedding, "block": block, "head": head}


def layer_costs(
    model: TransformerConfig,
    seq_len: int,
    hw: HardwareConfig | None = None,
    *,
    micro_batch_size: int = 1,
    dtype: str = "float32",
    tp: int = 1,
    recompute: bool = False,
) -> list[float]:
    """Seconds of forward + backward of one micro-batch per layer, in order: the embedding,
    each of the model.num_layers blocks, the head with the loss. The PP runtime balances its
    stages on these (`balanced_split`); without a hardware profile, the datasheet-free
    defaults (HardwareConfig(), the cpu preset's numbers) rank the layers just as well."""
    hw = HardwareConfig() if hw is None else hw
    parts = part_seconds(model, micro_batch_size * seq_len, seq_len, hw, dtype, tp, recompute)
    cost = {name: sum(terms.values()) for name, terms in parts.items()}
    return [cost["embedding"], *[cost["block"]] * model.num_layers, cost["head"]]


def balanced_split(costs: list[float], stages: int) -> list[int]:
    """Blocks per stage (each at least one) that minimise the slowest stage's cost, with the
    embedding (costs[0]) on the first stage and the head (costs[-1]) on the last. `costs` is
    what `layer_costs` returns."""
    blocks = costs[1:-1]
    n = len(blocks)
    if not 1 <= stages <= n:
        raise ValueError(f"{n} blocks cannot fill {stages} stages")
    prefix = [0.0]
    for c in blocks:
        prefix.append(prefix[-1] + c)

    def cost(stage: int, i: int, j: int) -> float:  # blocks i..j-1 on `stage`
        extra = (costs[0] if stage == 0 else 0.0) + (costs[-1] if stage == stages - 1 else 0.0)
        return prefix[j] - prefix[i] + extra

    inf = float("inf")
    # best[s][j]: the least possible slowest stage when stages 0..s-1 hold blocks 0..j-1
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n - (stages - s) + 1):
            for i in range(s - 1, j):
                value = max(best[s - 1][i], cost(s - 1, i, j))
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    split, j = [], n
    for s in range(stages, 0, -1):
        i = cut[s][j]
        split.append(j - i)
        j = i
    return split[::-1]


@dataclass(frozen=True)
class Stage:
    """What one pipeline rank holds: its blocks (all its virtual stages together), and the
    embedding (first rank) or the head (last rank)."""

    rank: int
    blocks: int
    embedding: bool
    head: bool


def rank_stages(split: list[int], p: int) -> list[Stage]:
    """Pipeline ranks from the blocks of each of the p x v stages: rank r runs stages r,
    r + p, r + 2p, ... (the interleaved order; v = 1 is one stage per rank)."""
    return [
        Stage(rank=r, blocks=sum(split[r::p]), embedding=r == 0, head=r == p - 1) for r in range(p)
    ]


def layout_stages(
    model: TransformerConfig, layout, hw: HardwareConfig | None = None
) -> list[Stage]:
    """The pipeline ranks of a Layout: parallel.pp_split when given, else balanced on
    `layer_costs` over pp x virtual stages."""
    p, v = layout.pp, layout.virtual_stages
    if p <= 1:
        return [Stage(rank=0, blocks=model.num_layers, embedding=True, head=True)]
    split = list(layout.pp_split) or balanced_split(
        layer_costs(
            model,
            layout.seq_len,
            hw,
            micro_batch_size=layout.micro_batch_size,
            dtype=layout.param_dtype,
            tp=layout.tp,
            recompute=layout.activation_checkpointing,
        ),
        p * v,
    )
    return rank_stages(split, p)
