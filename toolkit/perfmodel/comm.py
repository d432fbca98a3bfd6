"""FSDP2/HSDP communication per rank and step: bytes, calls, time and what stays exposed.

Every collective's time is NCCL's own cost model (src/graph/tuning.cc, ncclTopoGetAlgoTime,
Simple protocol): latency + bytes / algorithm bandwidth, for ring and, for an all-reduce
across nodes, tree; the cheaper one is taken, as NCCL's tuner does (`collective_time`). A
group's span (its ranks, how many of them share a node) picks the link: NVLink inside a
node, per-NIC bandwidth x NICs per node / ranks per node (rails) across nodes.

Exposure: the first all-gathers of each micro-step (the root unit and the first block, nothing
to hide behind yet) and the last reduce-scatter of the step (the root's, after the last
gradient) are exposed; the rest hides behind compute up to `comm_overlap` x the compute time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import TransformerConfig
from toolkit.train.flops import block_params, param_counts

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4  # FSDP2 keeps sharded parameters and their gradients in fp32
SMALL_ALL_REDUCES = 2  # the grad norm's and the loss/stop-vote all-reduce of every step


# NCCL's tuner (src/graph/tuning.cc): tree all-reduce bus bandwidth x 0.92 ("various model
# refinements"), ring all-reduce latency x 1.4 across nodes on sm80+ ("plateau effect of
# ring"), and the tree's correction for medium sizes, Simple protocol, per power of two of
# the message from 64 B (treeCorrectionFactor[NCCL_PROTO_SIMPLE]).
TREE_BANDWIDTH_FACTOR = 0.92
RING_ALLREDUCE_PLATEAU = 1.4
TREE_CORRECTION = (
    0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5,
    0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9,
)  # fmt: skip
KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class Span:
    """Where a process group lies and what its links give: `ranks` in the group,
    `ranks_per_node` of them on each node (= ranks when the group fits in one node)."""

    ranks: int
    ranks_per_node: int
    bus_bandwidth: float  # bytes/s: the slowest link a ring crosses (nccl-tests' busbw)
    call_latency_s: float  # per call (NCCL's baseLatencies; gloo: the measured call)
    intra_step_latency_s: float = 0.0  # per ring step or tree level inside a node
    inter_step_latency_s: float = 0.0  # per ring step or tree level across nodes

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / self.ranks_per_node)


def span(hw: HardwareConfig, ranks: int, group_ranks_per_node: int, node_ranks: int) -> Span:
    """The span of a group of `ranks` with `group_ranks_per_node` of them on a node of
    `node_ranks` ranks (all of a node's ranks talk at once, so they share its NICs)."""
    per_node = max(1, min(ranks, group_ranks_per_node))
    if per_node >= ranks:
        return Span(
            ranks, ranks, hw.intra_node_bandwidth, hw.intra_node_latency_s,
            hw.intra_node_step_latency_s, hw.intra_node_step_latency_s,
        )  # fmt: skip
    inter = inter_node_bandwidth_per_rank(hw, node_ranks)
    return Span(
        ranks, per_node, min(inter, hw.intra_node_bandwidth), hw.inter_node_latency_s,
        hw.intra_node_step_latency_s, hw.inter_node_step_latency_s,
    )  # fmt: skip


def inter_node_bandwidth_per_rank(hw: HardwareConfig, ranks_per_node: int) -> float:
    """A node's ranks share its NICs: per-NIC bandwidth x NICs / ranks on the node."""
    return hw.inter_node_bandwidth * hw.nics_per_node / max(1, ranks_per_node)


def ring_time(kind: str, size_bytes: float, s: Span) -> float:
    """Ring: (n-1) steps for an all-gather / reduce-scatter, 2(n-1) for an all-reduce, of
    which (nodes-1) resp. 2(nodes-1) cross nodes; each rank moves (n-1)/n resp. 2(n-1)/n of
    the buffer over the bus bandwidth (nccl-tests doc/PERFORMANCE.md; tuning.cc)."""
    n = s.ranks
    if n == 1:
        return 0.0
    twice = 2 if kind == "all_reduce" else 1
    steps, inter_steps = twice * (n - 1), twice * (s.nodes - 1)
    latency = (
        s.call_latency_s
        + (steps - inter_steps) * s.intra_step_latency_s
        + inter_steps * s.inter_step_latency_s
    )
    if kind == "all_reduce" and s.nodes > 1:
        latency *= RING_ALLREDUCE_PLATEAU
    return latency + size_bytes * twice * (n - 1) / n / s.bus_bandwidth


def tree_time(size_bytes: float, s: Span) -> float:
    """Tree all-reduce (NCCL's double binary tree across nodes, a chain inside each):
    latency 2 x ((ranks per node - 1) intra steps + log2(nodes) inter levels); algorithm
    bandwidth half of 0.92 x the bus bandwidth, x the tuner's medium-size correction."""
    levels = math.floor(math.log2(s.nodes))
    latency = s.call_latency_s + 2 * (
        (s.ranks_per_node - 1) * s.intra_step_latency_s + levels * s.inter_step_latency_s
    )
    bandwidth = 0.5 * TREE_BANDWIDTH_FACTOR * s.bus_bandwidth * tree_correction(size_bytes)
    return latency + size_bytes / bandwidth


def tree_correction(size_bytes: float) -> float:
    log_size = int(size_bytes) >> 6
    index = log_size.bit_length() - 1  # NCCL's log2i(nBytes >> 6)
    return TREE_CORRECTION[index] if 0 <= index < len(TREE_CORRECTION) else 1.0


def algorithm(kind: str, size_bytes: float, s: Span) -> str:
    """What NCCL's tuner picks: the cheaper of ring and (all-reduce across nodes) tree."""
    if kind != "all_reduce" or s.nodes == 1:
        return "ring"
    return "tree" if tree_time(size_bytes, s) < ring_time(kind, size_bytes, s) else "ring"


def collective_time(kind: str, size_bytes: float, s: Span) -> float:
    """Seconds of one collective on a `size_bytes` buffer (the gathered, reduced or
    all-reduced buffer, not the shard) over the group `s`, by the algorithm NCCL picks."""
    if kind not in KINDS:
        raise ValueError(f"collective kind {kind!r}: one of {', '.join(KINDS)}")
    if s.ranks == 1:
        return 0.0
    if algorithm(kind, size_bytes, s) == "tree":
        return tree_time(size_bytes, s)
    return ring_time(kind, size_bytes, s)


def calls_time(kind: str, received_bytes: float, calls: float, s: Span) -> float:
    """`calls` collectives whose rank receives `received_bytes` in all, each on the mean
    buffer (received = buffer x (n-1)/n, twice that for an all-reduce)."""
    if not calls or s.ranks == 1:
        return 0.0
    share = ring_fraction(s.ranks) * (2 if kind == "all_reduce" else 1)
    return calls * collective_time(kind, received_bytes / share / calls, s)


@dataclass(frozen=True)
class Links:
    """Spans of the FSDP shard group, the HSDP replica group and the whole world."""

    shard: Span
    replica: Span
    world: Span


def links(
    hw: HardwareConfig, shard_size: int, ranks_per_node: int, *, tp: int = 1, replicate: int = 1
) -> Links:
    """Spans in the mesh (tp fastest, then dp_shard, dp_replicate): a shard group's ranks
    sit tp apart, a replica group's tp x shard_size apart."""
    shard = span(hw, shard_size, ranks_per_node // tp, ranks_per_node)
    replica = span(hw, replicate, ranks_per_node // (tp * shard_size), ranks_per_node)
    world = span(hw, tp * shard_size * replicate, ranks_per_node, ranks_per_node)
    return Links(shard, replica, world)


def ring_fraction(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def collective_s(bytes_received: float, calls: float, bandwidth: float, latency_s: float) -> float:
    """Point-to-point sends (and the plain latency + bytes / bandwidth model)."""
    return calls * latency_s + bytes_received / bandwidth


def communication(
    model: TransformerConfig,
    *,
    shard_size: int,
    replicate: int,
    grad_accum: int,
    param_dtype: str,
    reduce_dtype: str,
    reshard_after_forward: bool,
) -> dict[str, float]:
    """Bytes each rank receives and collective calls per optimizer step, by collective."""
    total = param_counts(model)["total"]
    block = block_params(model.dim, model.mlp_ratio)
    return fsdp_communication(
        total=total,
        block=block,
        blocks=model.num_layers,
        shard_size=shard_size,
        replicate=replicate,
        grad_accum=grad_accum,
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        reshard_after_forward=reshard_after_forward,
    )


def fsdp_communication(
    *,
    total: float,
    block: float,
    blocks: int,
    shard_size: int,
    replicate: int,
    grad_accum: int,
    param_dtype: str,
    reduce_dtype: str,
    reshard_after_forward: bool,
    reductions: int = 1,
    forward_gathers: int | None = None,
) -> dict[str, float]:
    """FSDP2/HSDP traffic of a rank holding `total` parameters: `blocks` block units of
    `block` parameters each and a root unit of the rest (none on a middle pipeline stage).
    Under tensor parallelism the counts are the rank's tensor-parallel shard.

    `reductions`: reduce-scatters of each unit per step (1: the last micro-step's only,
    trainer.grad_sync=last; grad_accum: every micro-step's). `forward_gathers`: micro-steps
    whose forward gathers the parameters (None: all; 1 when they stay unsharded between
    micro-steps, trainer.reshard_between_micro_steps=false). HSDP's replica all-reduce runs
    once per step either way (set_requires_all_reduce on the last micro-step only)."""
    forward_gathers = grad_accum if forward_gathers is None else forward_gathers
    p_bytes = DTYPE_BYTES[param_dtype]
    r_bytes = DTYPE_BYTES[reduce_dtype]
    root = total - blocks * block
    frac = ring_fraction(shard_size)
    units = blocks + (1 if root > 0 else 0)
    # Forward gathers every unit once per micro-step; with reshard_after_forward backward
    # gathers every block but the last again (the last is kept, the root is not resharded).
    regathered = blocks - 1 if reshard_after_forward else 0
    gathers = shard_size > 1
    r = replicate
    gathered = forward_gathers * total + grad_accum * regathered * block
    return {
        "allgather_bytes": gathered * p_bytes * frac,
        "allgather_calls": forward_gathers * units + grad_accum * regathered if gathers else 0,
        "first_allgather_bytes": forward_gathers * (root + block) * p_bytes * frac,
        "first_allgather_calls": (1 + int(root > 0)) * forward_gathers if gathers else 0,
        "reduce_scatter_bytes": reductions * total * r_bytes * frac,
        "reduce_scatter_calls": reductions * units if gathers else 0,
        "last_reduce_scatter_bytes": (root if root > 0 else block) * r_bytes * frac,
        "replica_allreduce_bytes": 2.0 * (r - 1) / r * total / shard_size * r_bytes if r > 1 else 0,
        "replica_allreduce_calls": units if r > 1 else 0,
        "small_allreduce_calls": SMALL_ALL_REDUCES if shard_size * r > 1 else 0,
    }


def fsdp_copy_bytes(
    *,
    total: float,
    block: float,
    blocks: int,
    shard_size: int,
    grad_accum: int,
    param_dtype: str,
    reduce_dtype: str,
    reshard_after_forward: bool,
    reductions: int = 1,
    forward_gathers: int | None = None,
) -> float:
    """Bytes FSDP2's own copies move per step on a rank (memory traffic, not the link's),
    on one rank as on many (torch.distributed.fsdp._fully_shard._fsdp_collectives):

    * all-gather copy-in: each sharded fp32 parameter is read and written, cast to the
      param dtype, into the gather buffer (4 + p bytes per shard element);
    * all-gather copy-out: the gathered buffer is split into the unsharded parameters (read
      and write p bytes per unsharded element);
    * reduce-scatter copy-in (chunk_cat): the unsharded gradients are read and written,
      cast to the reduce dtype, into the reduce buffer (p + r per unsharded element);
    * the reduced shard becomes the fp32 sharded gradient (r + 4 per shard element);
    * grad accumulation: every micro-step after the first adds its unsharded gradients into
      the kept ones, held in the reduce dtype (read p and r, write r per element); reducing
      every micro-step (`reductions` = grad_accum) instead adds each reduced shard into the
      fp32 sharded gradient (read 4 and 4, write 4 per shard element).

    Gathers and reduces are counted as in `fsdp_communication`."""
    forward_gathers = grad_accum if forward_gathers is None else forward_gathers
    p = DTYPE_BYTES[param_dtype]
    r = DTYPE_BYTES[reduce_dtype]
    regathered = blocks - 1 if reshard_after_forward else 0
    gathered = forward_gathers * total + grad_accum * regathered * block
    allgather = gathered * ((FP32 + p) / shard_size + 2 * p)
    reduce_scatter = reductions * total * ((p + r) + (r + FP32) / shard_size)
    if reductions > 1:
        accumulate = (reductions - 1) * total / shard_size * 3 * FP32
    else:
        accumulate = (grad_accum - 1) * total * (p + 2 * r)
    return allgather + reduce_scatter + accumulate


def communication_time(
    comm: dict[str, float], link: Links, compute_s: float, overlap: float
) -> dict[str, float]:
    """Seconds per step: every collective, the part that cannot overlap, and the exposed
    total (first gathers + last reduce-scatter + what compute cannot hide)."""
    shard = link.shard
    allgather = calls_time("all_gather", comm["allgather_bytes"], comm["allgather_calls"], shard)
    reduce_scatter = calls_time(
        "reduce_scatter", comm["reduce_scatter_bytes"], comm["reduce_scatter_calls"], shard
    )
    replica = calls_time(
        "all_reduce", comm["replica_allreduce_bytes"], comm["replica_allreduce_calls"], link.replica
    )
    first = calls_time(
        "all_gather", comm["first_allgather_bytes"], comm["first_allgather_calls"], shard
    )
    last = calls_time(
        "reduce_scatter",
        comm["last_reduce_scatter_bytes"],
        1 if comm["reduce_scatter_calls"] else 0,
        shard,
    )
    # the grad norm's and the loss's all-reduces of one fp32 over every rank
    small = comm["small_allreduce_calls"] * collective_time("all_reduce", FP32, link.world)
    total = allgather + reduce_scatter + replica
    rest = max(0.0, total - first - last)
    hidden = min(rest, overlap * compute_s)
    return {
        "allgather_s": allgather,
        "reduce_scatter_s": reduce_scatter,
        "replica_allreduce_s": replica,
        "small_allreduce_s": small,
        "total_s": total + small,
        "first_allgather_s": first,
        "last_reduce_scatter_s": last,
        "exposed_s": first + last + rest - hidden,  # the small all-reduces count in optimizer
    }
