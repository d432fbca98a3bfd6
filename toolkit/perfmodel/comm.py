"""FSDP2/HSDP communication per rank and step: bytes, calls, time and what stays exposed.

Ring collectives: a rank receives (n-1)/n of a gathered or reduced buffer; an all-reduce
moves twice that. Each call costs a latency plus bytes / bandwidth. Inter-node bandwidth per
rank is per-NIC bandwidth x NICs per node / ranks per node (rails).

Exposure: the first all-gathers of each micro-step (the root unit and the first block, nothing
to hide behind yet) and the last reduce-scatter of the step (the root's, after the last
gradient) are exposed; the rest hides behind compute up to `comm_overlap` x the compute time.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import TransformerConfig
from toolkit.train.flops import block_params, param_counts

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4  # FSDP2 keeps sharded parameters and their gradients in fp32
SMALL_ALL_REDUCES = 2  # the grad norm's and the loss/stop-vote all-reduce of every step


@dataclass(frozen=True)
class Links:
    """Per-rank bandwidth (bytes/s) and per-call latency (s) of the shard and replica groups."""

    shard_bandwidth: float
    shard_latency_s: float
    replica_bandwidth: float
    replica_latency_s: float


def inter_node_bandwidth_per_rank(hw: HardwareConfig, ranks_per_node: int) -> float:
    """A node's ranks share its NICs: per-NIC bandwidth x NICs / ranks on the node."""
    return hw.inter_node_bandwidth * hw.nics_per_node / max(1, ranks_per_node)


def links(hw: HardwareConfig, shard_size: int, ranks_per_node: int) -> Links:
    inter = inter_node_bandwidth_per_rank(hw, ranks_per_node)
    within = shard_size <= ranks_per_node
    return Links(
        shard_bandwidth=hw.intra_node_bandwidth if within else inter,
        shard_latency_s=hw.intra_node_latency_s if within else hw.inter_node_latency_s,
        replica_bandwidth=inter,
        replica_latency_s=hw.inter_node_latency_s,
    )


def ring_fraction(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def collective_s(bytes_received: float, calls: float, bandwidth: float, latency_s: float) -> float:
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
    shard_bw, shard_lat = link.shard_bandwidth, link.shard_latency_s
    allgather = collective_s(comm["allgather_bytes"], comm["allgather_calls"], shard_bw, shard_lat)
    reduce_scatter = collective_s(
        comm["reduce_scatter_bytes"], comm["reduce_scatter_calls"], shard_bw, shard_lat
    )
    replica = collective_s(
        comm["replica_allreduce_bytes"],
        comm["replica_allreduce_calls"],
        link.replica_bandwidth,
        link.replica_latency_s,
    )
    first = collective_s(
        comm["first_allgather_bytes"], comm["first_allgather_calls"], shard_bw, shard_lat
    )
    last = collective_s(
        comm["last_reduce_scatter_bytes"],
        1 if comm["reduce_scatter_calls"] else 0,
        shard_bw,
        shard_lat,
    )
    small = comm["small_allreduce_calls"] * max(
        shard_lat, link.replica_latency_s if comm["replica_allreduce_calls"] else 0.0
    )
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
