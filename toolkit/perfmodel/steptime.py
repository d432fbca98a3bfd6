"""Step time and communication per rank, term by term, for every layout (pure arithmetic).

Per pipeline rank, one micro-batch costs its kernels (toolkit.perfmodel.kernels, summed over
the parts it holds), its tensor-parallel collectives (critical path, toolkit.perfmodel.tp)
and its point-to-point sends; the pipelined part of the step is the slowest rank's
micro-batch time x (m + (p-1)/v) (toolkit.perfmodel.pipeline). FSDP2 traffic, its exposure
and the optimizer are per rank on top. Without pp and tp this is the FSDP/HSDP model:

    step_s = gemm + attention + elementwise + overhead + fsdp_copy + exposed communication
             + optimizer (+ tp_communication + pipeline_p2p + pipeline_bubble)
"""

from __future__ import annotations

from typing import Any

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import TransformerConfig
from toolkit.perfmodel import comm as comm_model
from toolkit.perfmodel import kernels, pipeline, tp
from toolkit.perfmodel.comm import DTYPE_BYTES
from toolkit.perfmodel.layout import Layout

COMPUTE_TERMS = ("gemm", "attention", "elementwise", "overhead")  # per micro-batch
STEP_COMPUTE_TERMS = (*COMPUTE_TERMS, "fsdp_copy")  # + FSDP2's copies, per step
EMBEDDING_TENSORS, HEAD_TENSORS = 2, 3  # token + position embeddings; final norm w/b, head


def fsdp_unit_collectives(
    model: TransformerConfig, layout: Layout, blocks: int | None = None
) -> int:
    """Unit all-gathers and reduce-scatters FSDP2 runs per step on a rank holding `blocks`
    blocks (all of them by default), whatever the world size (copy-in/copy-out happen even
    on one rank)."""
    blocks = model.num_layers if blocks is None else blocks
    units = blocks + 1
    regathered = blocks - 1 if layout.reshard_after_forward else 0
    gathers = forward_gathers(layout) * units + layout.grad_accum * regathered
    return gathers + layout.reductions * units


def forward_gathers(layout: Layout) -> int:
    """Micro-steps whose forward gathers the parameters: all, or only the first when they
    stay unsharded between micro-steps."""
    return 1 if layout.keeps_params_gathered else layout.grad_accum


def stage_params(
    model: TransformerConfig, layout: Layout, stage: pipeline.Stage
) -> dict[str, float]:
    local = tp.local_params(model, layout.tp)
    root = local["embedding"] * stage.embedding + local["head"] * stage.head
    return {"block": local["block"], "total": root + stage.blocks * local["block"]}


def fsdp_units(model: TransformerConfig, layout: Layout, stage: pipeline.Stage) -> dict[str, Any]:
    """What FSDP2 shards on a stage's rank and how it runs, as toolkit.perfmodel.comm's
    fsdp_communication and fsdp_copy_bytes take it."""
    params = stage_params(model, layout, stage)
    return {
        "total": params["total"],
        "block": params["block"],
        "blocks": stage.blocks,
        "shard_size": layout.shard_size,
        "grad_accum": layout.grad_accum,
        "param_dtype": layout.param_dtype,
        "reduce_dtype": layout.reduce_dtype,
        "reshard_after_forward": layout.reshard_after_forward,
        "reductions": layout.reductions,
        "forward_gathers": forward_gathers(layout),
    }


def fsdp_traffic(
    model: TransformerConfig, layout: Layout, stage: pipeline.Stage
) -> dict[str, float]:
    c = comm_model.fsdp_communication(
        **fsdp_units(model, layout, stage), replicate=layout.replicate
    )
    if layout.world_size > 1:  # the grad norm and loss all-reduces span every rank
        c["small_allreduce_calls"] = comm_model.SMALL_ALL_REDUCES
    return c


def fsdp_copy_s(
    model: TransformerConfig, layout: Layout, hw: HardwareConfig, stage: pipeline.Stage
) -> float:
    """Seconds of FSDP2's copy-in/copy-out per step (toolkit.perfmodel.comm.fsdp_copy_bytes)
    at the rank's copy rate."""
    copy_bytes = comm_model.fsdp_copy_bytes(**fsdp_units(model, layout, stage))
    rate = hw.memory_bandwidth * hw.fsdp_copy_fraction
    return copy_bytes / (rate * kernels.rank_speed(hw, layout.ranks_per_node))


def links(hw: HardwareConfig, layout: Layout) -> dict[str, tuple[float, float]]:
    """(bandwidth per rank, latency) of the pipeline's point-to-point sends: inside a node
    only when the whole pipeline is (pp is the mesh's outermost dimension)."""
    inter = (
        comm_model.inter_node_bandwidth_per_rank(hw, layout.ranks_per_node),
        hw.inter_node_latency_s,
    )
    intra = (hw.intra_node_bandwidth, hw.intra_node_latency_s)
    return {"pp": intra if layout.pp_within_node else inter}


def spans(hw: HardwareConfig, layout: Layout) -> comm_model.Links:
    """Spans of the shard, replica and world groups in the mesh (tp fastest, then
    dp_shard, dp_replicate, pp: toolkit.config.parallel.MeshShape)."""
    per_node = layout.ranks_per_node
    link = comm_model.links(
        hw, layout.shard_size, per_node, tp=layout.tp, replicate=layout.replicate
    )
    world = comm_model.span(hw, layout.world_size, per_node, per_node)
    return comm_model.Links(link.shard, link.replica, world)


def tp_span(hw: HardwareConfig, layout: Layout) -> comm_model.Span:
    """A tp group is tp consecutive ranks: NVLink inside a node, across nodes beyond it."""
    return comm_model.span(hw, layout.tp, layout.ranks_per_node, layout.ranks_per_node)


def stage_time(
    model: TransformerConfig, layout: Layout, hw: HardwareConfig, stage: pipeline.Stage
) -> dict[str, float]:
    """Seconds on one pipeline rank: per micro-batch (`*_mb_s`) and per step (FSDP, optimizer)."""
    tokens = layout.micro_batch_size * layout.seq_len
    ac = layout.activation_checkpointing
    dtype = layout.param_dtype
    parts = pipeline.part_seconds(model, tokens, layout.seq_len, hw, dtype, layout.tp, ac)
    speed = kernels.rank_speed(hw, layout.ranks_per_node)
    slowdown = kernels.overhead_slowdown(hw, layout.ranks_per_node)
    count = {"embedding": int(stage.embedding), "block": stage.blocks, "head": int(stage.head)}
    per_mb = {
        term: sum(n * parts[part][term] for part, n in count.items()) for term in COMPUTE_TERMS
    }
    for term in ("gemm", "attention", "elementwise"):
        per_mb[term] /= speed
    per_mb["overhead"] *= slowdown
    link = links(hw, layout)
    tp_c = tp.collectives(
        model,
        blocks=stage.blocks,
        embedding=stage.embedding,
        head=stage.head,
        tokens=tokens,
        act_bytes=DTYPE_BYTES[dtype],
        tp=layout.tp,
        recompute=ac,
    )
    per_mb["tp_communication"] = tp.collectives_s(tp_c, tp_span(hw, layout))
    p2p_calls = 2 * layout.virtual_stages if layout.pp > 1 else 0  # forward out, gradient back
    p2p = pipeline.p2p_bytes(
        layout.micro_batch_size, layout.seq_len, model.dim, DTYPE_BYTES[dtype], layout.tp
    )
    per_mb["pipeline_p2p"] = comm_model.collective_s(p2p_calls * p2p, p2p_calls, *link["pp"])

    m = layout.grad_accum
    fsdp_overhead = (
        slowdown
        * fsdp_unit_collectives(model, layout, stage.blocks)
        * hw.fsdp_collective_overhead_s
    )
    copy_s = fsdp_copy_s(model, layout, hw, stage)
    compute_s = m * sum(per_mb[t] for t in COMPUTE_TERMS) + fsdp_overhead + copy_s
    traffic = fsdp_traffic(model, layout, stage)
    ct = comm_model.communication_time(traffic, spans(hw, layout), compute_s, hw.comm_overlap)
    local_params = stage_params(model, layout, stage)["total"] / layout.shard_size
    tensors = (
        kernels.TENSORS_PER_BLOCK * stage.blocks
        + EMBEDDING_TENSORS * stage.embedding
        + HEAD_TENSORS * stage.head
    )
    fused = layout.fused_optimizer
    optimizer_ops = kernels.optimizer_launches(tensors, local_params, hw.num_sms > 0, fused)
    optimizer_launch_s = optimizer_ops * hw.optimizer_op_overhead_s * slowdown
    optimizer_s = (
        kernels.optimizer_bytes(local_params, fused) / (hw.memory_bandwidth * speed)
        + optimizer_launch_s
        + ct["small_allreduce_s"]
    )
    ops_mb = sum(n * parts[part]["overhead"] for part, n in count.items()) / hw.op_overhead_s
    return {
        **{f"{k}_mb_s": v for k, v in per_mb.items()},
        "micro_batch_s": sum(per_mb.values()),
        "fsdp_overhead_s": fsdp_overhead,
        "fsdp_copy_s": copy_s,
        "fsdp_exposed_s": ct["exposed_s"],
        "fsdp_total_s": ct["total_s"],
        "first_allgather_s": ct["first_allgather_s"],
        "last_reduce_scatter_s": ct["last_reduce_scatter_s"],
        "optimizer_s": optimizer_s,
        "optimizer_launch_s": optimizer_launch_s,
        # Kernel launches (ops dispatched) per step: the micro-steps' and the optimizer's.
        "launches": m * ops_mb + optimizer_ops if hw.op_overhead_s > 0 else 0.0,
        "small_allreduce_s": ct["small_allreduce_s"],
        "tp_bytes_mb": tp_c["bytes"] + tp_c["allreduce_bytes"],
        "tp_calls_mb": tp_c["calls"] + tp_c["allreduce_calls"],
        "p2p_bytes_mb": p2p_calls * p2p,
    }


def link_name(used: bool, within: bool) -> str:
    if not used:
        return "-"
    return "intra-node" if within else "inter-node"


def step_time(
    model: TransformerConfig,
    layout: Layout,
    hw: HardwareConfig,
    stages: list[pipeline.Stage] | None = None,
) -> dict[str, float | str]:
    """Seconds per step by term, for the pipeline rank whose step ends last;
    `forward_backward_s` and `optimizer_s` are the phases a step record measures."""
    stages = pipeline.layout_stages(model, layout, hw) if stages is None else stages
    per_stage = [stage_time(model, layout, hw, s) for s in stages]
    m, p, v = layout.grad_accum, layout.pp, layout.virtual_stages
    slowest = max(t["micro_batch_s"] for t in per_stage)
    pipelined = pipeline.pipeline_s(slowest, layout.pp_schedule, p, m, v)

    def extra(t: dict[str, float]) -> float:
        return t["fsdp_overhead_s"] + t["fsdp_copy_s"] + t["fsdp_exposed_s"] + t["optimizer_s"]

    critical = max(range(len(per_stage)), key=lambda i: extra(per_stage[i]))
    t = per_stage[critical]
    terms = {
        "gemm": m * t["gemm_mb_s"],
        "attention": m * t["attention_mb_s"],
        "elementwise": m * t["elementwise_mb_s"],
        "overhead": m * t["overhead_mb_s"] + t["fsdp_overhead_s"],
        "fsdp_copy": t["fsdp_copy_s"],
        "communication": t["fsdp_exposed_s"],
        "optimizer": t["optimizer_s"],
        "tp_communication": m * t["tp_communication_mb_s"],
        "pipeline_p2p": m * t["pipeline_p2p_mb_s"],
        "pipeline_bubble": pipelined - m * t["micro_batch_s"],
    }
    compute_s = sum(terms[k] for k in STEP_COMPUTE_TERMS)
    step_s = pipelined + extra(t)
    return {
        **{f"{k}_s": val for k, val in terms.items()},
        "compute_s": compute_s,
        "communication_total_s": t["fsdp_total_s"]
        + terms["tp_communication"]
        + terms["pipeline_p2p"],
        "first_allgather_s": t["first_allgather_s"],
        "last_reduce_scatter_s": t["last_reduce_scatter_s"],
        "small_allreduce_s": t["small_allreduce_s"],
        # The launch floor's parts (toolkit.perfmodel.small): the optimizer's per-op cost
        # inside the optimizer term, the launches behind the overhead term.
        "optimizer_launch_s": t["optimizer_launch_s"],
        "launches": t["launches"],
        "fsdp_overhead_s": t["fsdp_overhead_s"],  # FSDP2's per-unit cost, in `overhead`
        "forward_backward_s": step_s - t["optimizer_s"],
        "data_wait_s": 0.0,
        "step_s": step_s,
        "bubble_fraction": pipeline.bubble_fraction(layout.pp_schedule, p, m, v),
        "stage_micro_batch_s": [s["micro_batch_s"] for s in per_stage],
        "critical_stage": critical,
        "tp_link": link_name(layout.tp > 1, layout.tp_within_node),
        "pp_link": link_name(layout.pp > 1, layout.pp_within_node),
        "uncertainty": hw.uncertainty,
        "dominant": max(terms, key=lambda k: terms[k]),
    }


def communication(
    model: TransformerConfig, layout: Layout, stages: list[pipeline.Stage] | None = None
) -> dict[str, float]:
    """Bytes and calls per rank and step, split by link, for the pipeline rank that moves
    the most (the only one without pp): FSDP2 (toolkit.perfmodel.comm), tensor-parallel
    collectives and point-to-point sends."""
    stages = pipeline.layout_stages(model, layout) if stages is None else stages
    rows = []
    act = DTYPE_BYTES[layout.param_dtype]
    tokens = layout.micro_batch_size * layout.seq_len
    m = layout.grad_accum
    for s in stages:
        c = fsdp_traffic(model, layout, s)
        tp_c = tp.collectives(
            model,
            blocks=s.blocks,
            embedding=s.embedding,
            head=s.head,
            tokens=tokens,
            act_bytes=act,
            tp=layout.tp,
            recompute=layout.activation_checkpointing,
        )
        c["tp_bytes"] = m * (tp_c["bytes"] + tp_c["allreduce_bytes"])
        c["tp_calls"] = m * (tp_c["calls"] + tp_c["allreduce_calls"])
        sends = 2 * layout.virtual_stages if layout.pp > 1 else 0
        per_send = pipeline.p2p_bytes(
            layout.micro_batch_size, layout.seq_len, model.dim, act, layout.tp
        )
        c["p2p_bytes"] = m * sends * per_send
        c["p2p_calls"] = m * sends
        fsdp = c["allgather_bytes"] + c["reduce_scatter_bytes"]
        by_link = {
            "shard": (fsdp, layout.shard_within_node),
            "replica": (c["replica_allreduce_bytes"], False),
            "tp": (c["tp_bytes"], layout.tp_within_node),
            "pp": (c["p2p_bytes"], layout.pp_within_node),
        }
        c["intra_node_bytes"] = sum(b for b, within in by_link.values() if within)
        c["inter_node_bytes"] = sum(b for b, within in by_link.values() if not within)
        c["stage"] = s.rank
        rows.append(c)
    return max(rows, key=lambda c: c["intra_node_bytes"] + c["inter_node_bytes"])
