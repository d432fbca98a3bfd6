"""The performance model for a model it has no formulas for (your LSTM, TCN, a Hugging Face
model): the same terms, from what counting measured (toolkit.perfmodel.counted: FLOPs,
parameters and saved activations of one forward + backward on meta tensors). Pure
arithmetic, no torch: the caller counts.

Per rank and step, data parallelism only (FSDP2 / HSDP; a model without a tensor-parallel
plan or pipeline split runs no other layout):

* compute: the counted FLOPs at the profile's achievable matmul rate (the median of its
  measured fractions for the dtype: counting gives FLOPs, not shapes), plus the saved
  activations written in forward and read in backward at the elementwise rate;
* FSDP2: the parameters' all-gathers and reduce-scatters over `units` units of equal size
  (toolkit.perfmodel.comm), exposed beyond the compute they hide behind, and their copies;
* optimizer: the fp32 shard's bytes for AdamW (toolkit.perfmodel.kernels.optimizer_bytes);
* memory: fp32 parameter, gradient and optimizer shards, two gathered units, the saved
  activations of a micro-batch (with activation checkpointing: the units' inputs, estimated
  as one unit's share, plus one unit recomputed), the accumulated gradients as grad_sync
  says;
* overhead, the launch floor (toolkit.perfmodel.small): the aten ops counting saw per
  micro-step (`ops_per_micro_step`) x the cost of one aten op (`aten_op_s`), plus FSDP2's
  fixed cost per unit collective (`fsdp_collective_overhead_s`); the optimizer's foreach
  ops per parameter tensor x `optimizer_op_overhead_s`, inside the optimizer term with the
  step's small all-reduces (grad norm, loss), as for the built-in transformers. A count
  recorded without ops (an older RUN/model.json) charges no per-op cost: a floor.

The cost of one aten op: the profile's `op_overhead_s` is measured per *kernel* of the
built-in block (toolkit.measure.hardware.op_overhead: the block at dim 8 forward + backward
over its BLOCK_FORWARD_OPS x (1 + BACKWARD_OPS_FACTOR) kernels); the same block dispatches
BLOCK_ATEN_OPS aten ops as counting counts them (views and detaches included), so one aten
op costs op_overhead_s x kernels / BLOCK_ATEN_OPS (tests/perfmodel/test_counted_ops.py
keeps the constant in step with the counter).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from toolkit.config.hardware import HardwareConfig
from toolkit.perfmodel import comm as comm_model
from toolkit.perfmodel import kernels
from toolkit.perfmodel.comm import DTYPE_BYTES
from toolkit.perfmodel.layout import Layout
from toolkit.perfmodel.memory import accumulated_grads_bytes
from toolkit.perfmodel.memory_options import optimizer_state_bytes_per_param
from toolkit.perfmodel.prediction import Prediction, device_capacity
from toolkit.perfmodel.steptime import forward_gathers

FP32 = 4


@dataclass(frozen=True)
class CountedShape:
    """A model as counting measured it, per sample (toolkit.perfmodel.counted.CountedCost)."""

    name: str
    flops_per_sample: float  # forward + backward (model FLOPs)
    forward_flops_per_sample: float
    num_params: int
    saved_bytes_per_sample: float  # activations saved for backward, in the counted dtype
    units: int = 1  # FSDP2 units (the spec's), besides the root
    tokens_per_sample: int = 0  # 0: a sample is not a sequence of tokens
    ops_per_micro_step: int = 0  # aten ops of one forward + backward (0: not counted)
    param_tensors: int = 0  # parameter tensors (0: not counted)


# The built-in block at dim 8 (what the profile times for op_overhead_s): aten ops of one
# forward + .sum() + backward on meta, as toolkit.perfmodel.counted.OpCounter counts them.
BLOCK_ATEN_OPS = 126
BLOCK_KERNELS = kernels.BLOCK_FORWARD_OPS * (1 + kernels.BACKWARD_OPS_FACTOR)


def aten_op_s(hw: HardwareConfig) -> float:
    """Seconds per counted aten op: the profile's per-kernel cost over the aten ops per
    kernel of the block it was measured on."""
    return hw.op_overhead_s * BLOCK_KERNELS / BLOCK_ATEN_OPS


def unit_collectives(units: int, layout: Layout) -> int:
    """FSDP2's unit all-gathers and reduce-scatters per step for `units` units and the
    root (toolkit.perfmodel.steptime.fsdp_unit_collectives, for a counted model)."""
    regathered = units - 1 if layout.reshard_after_forward else 0
    gathers = forward_gathers(layout) * (units + 1) + layout.grad_accum * regathered
    return gathers + layout.reductions * (units + 1)


def matmul_rate(hw: HardwareConfig, dtype: str) -> float:
    """Achievable matmul FLOP/s: the peak times the median measured fraction for the dtype
    (all the profile's shapes; 1 where it has none, as the presets' nominal peaks)."""
    fractions = [p.fraction for p in hw.matmul if p.dtype == dtype]
    return hw.peak_flops(dtype) * (statistics.median(fractions) if fractions else 1.0)


def predict_counted(model: CountedShape, layout: Layout, hw: HardwareConfig) -> Prediction:
    samples = layout.micro_batch_size * layout.grad_accum * layout.dp
    ac = layout.activation_checkpointing
    executed_per_sample = model.flops_per_sample + (model.forward_flops_per_sample if ac else 0)
    model_flops = model.flops_per_sample * samples
    executed = executed_per_sample * samples
    flops = {
        "flops_per_sample": model.flops_per_sample,
        "flops_per_token": model.flops_per_sample / max(1, model.tokens_per_sample),
        "model_flops_per_step": model_flops,
        "recompute_flops_per_step": executed - model_flops,
        "executed_flops_per_step": executed,
        "executed_flops_per_rank": executed / layout.world_size,
    }
    dtype = layout.param_dtype
    speed = kernels.rank_speed(hw, layout.ranks_per_node)
    micro = layout.micro_batch_size
    gemm_mb = micro * executed_per_sample / (matmul_rate(hw, dtype) * speed)
    saved_mb = micro * model.saved_bytes_per_sample
    elementwise_mb = 2 * saved_mb / (hw.memory_bandwidth * hw.elementwise_fraction * speed)

    total = float(model.num_params)
    units = max(1, model.units)
    fsdp = {
        "total": total,
        "block": total / units,
        "blocks": units,
        "shard_size": layout.shard_size,
        "grad_accum": layout.grad_accum,
        "param_dtype": dtype,
        "reduce_dtype": layout.reduce_dtype,
        "reshard_after_forward": layout.reshard_after_forward,
        "reductions": layout.reductions,
        "forward_gathers": forward_gathers(layout),
    }
    traffic = comm_model.fsdp_communication(**fsdp, replicate=layout.replicate)
    copy_s = comm_model.fsdp_copy_bytes(**fsdp) / (
        hw.memory_bandwidth * hw.fsdp_copy_fraction * speed
    )
    m = layout.grad_accum
    slowdown = kernels.overhead_slowdown(hw, layout.ranks_per_node)
    ops_mb = model.ops_per_micro_step * (2 if ac else 1)  # checkpointing: the forward again
    fsdp_overhead_s = slowdown * unit_collectives(units, layout) * hw.fsdp_collective_overhead_s
    overhead_s = m * ops_mb * aten_op_s(hw) * slowdown + fsdp_overhead_s
    compute_s = m * (gemm_mb + elementwise_mb) + overhead_s + copy_s
    link = comm_model.links(
        hw, layout.shard_size, layout.ranks_per_node, replicate=layout.replicate
    )
    ct = comm_model.communication_time(traffic, link, compute_s, hw.comm_overlap)
    local = total / layout.shard_size
    fused = layout.fused_optimizer
    optimizer_ops = kernels.optimizer_launches(model.param_tensors, local, hw.num_sms > 0, fused)
    optimizer_launch_s = optimizer_ops * hw.optimizer_op_overhead_s * slowdown
    optimizer_s = (
        kernels.optimizer_bytes(local, fused) / (hw.memory_bandwidth * speed)
        + optimizer_launch_s
        + ct["small_allreduce_s"]  # as the transformers' term: the split takes it out
    )
    step_s = compute_s + ct["exposed_s"] + optimizer_s
    terms = {
        "gemm": m * gemm_mb,
        "elementwise": m * elementwise_mb,
        "overhead": overhead_s,
        "fsdp_copy": copy_s,
        "communication": ct["exposed_s"],
        "optimizer": optimizer_s,
    }
    time: dict[str, Any] = {
        **{f"{k}_s": v for k, v in terms.items()},
        "attention_s": 0.0,
        "optimizer_launch_s": optimizer_launch_s,
        # Ops dispatched per step (toolkit.perfmodel.small's launch floor); 0: not counted.
        "launches": m * ops_mb + optimizer_ops if model.ops_per_micro_step else 0.0,
        "fsdp_overhead_s": fsdp_overhead_s,
        "tp_communication_s": 0.0,
        "pipeline_p2p_s": 0.0,
        "pipeline_bubble_s": 0.0,
        "compute_s": compute_s,
        "communication_total_s": ct["total_s"],
        "first_allgather_s": ct["first_allgather_s"],
        "last_reduce_scatter_s": ct["last_reduce_scatter_s"],
        "small_allreduce_s": ct["small_allreduce_s"],
        "forward_backward_s": step_s - optimizer_s,
        "data_wait_s": 0.0,
        "step_s": step_s,
        "bubble_fraction": 0.0,
        "uncertainty": hw.uncertainty,
        "dominant": max(terms, key=lambda k: terms[k]),
        "counted": True,
        "tp_link": "-",
        "pp_link": "-",
        "critical_stage": 0,
        "stage_micro_batch_s": [gemm_mb + elementwise_mb + (overhead_s - fsdp_overhead_s) / m],
    }
    memory = counted_memory(model, layout, device_capacity(hw, layout.ranks_per_node))
    communication = {
        **traffic,
        **dict.fromkeys(("tp_bytes", "tp_calls", "p2p_bytes", "p2p_calls"), 0.0),
        "intra_node_bytes": 0.0,
        "inter_node_bytes": 0.0,
        "stage": 0,
    }
    moved = traffic["allgather_bytes"] + traffic["reduce_scatter_bytes"]
    communication["intra_node_bytes" if layout.shard_within_node else "inter_node_bytes"] = moved
    tokens = samples * max(1, model.tokens_per_sample)
    return Prediction(flops, memory, communication, time, tokens, layout.world_size)


def counted_memory(model: CountedShape, layout: Layout, capacity_bytes: float) -> dict[str, Any]:
    """Bytes per rank at the start of backward (the peak for these layouts)."""
    total = float(model.num_params)
    units = max(1, model.units)
    shard = layout.shard_size
    p_bytes = DTYPE_BYTES[layout.param_dtype]
    params = total * FP32 / shard
    grads = total * FP32 / shard
    optimizer = optimizer_state_bytes_per_param(layout.optimizer) * total / shard
    allgather = min(2, units) * total / units * p_bytes
    saved = layout.micro_batch_size * model.saved_bytes_per_sample
    activations = 2 * saved / units if layout.activation_checkpointing and units > 1 else saved
    accumulated = accumulated_grads_bytes(total, layout)
    terms = {
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": optimizer,
        "allgather_bytes": allgather,
        "accumulated_grads_bytes": accumulated,
        "activations_bytes": activations,
    }
    backward_peak = params + optimizer + allgather + activations + accumulated
    optimizer_peak = params + grads + optimizer + params
    peak = max(backward_peak, optimizer_peak)
    return {
        **terms,
        "stage": 0,
        "stage_peaks_bytes": [peak],
        "capacity_bytes": capacity_bytes,
        "fits": float(peak <= capacity_bytes),
        "largest_term": max(terms, key=lambda k: terms[k]),
        "grad_sync": layout.grad_sync,
        "state_bytes": params + grads + optimizer,
        "backward_peak_bytes": backward_peak,
        "optimizer_peak_bytes": optimizer_peak,
        "optimizer_state_bytes_per_param": optimizer_state_bytes_per_param(layout.optimizer),
        # Terms of the transformers' model that a counted model has none of.
        **dict.fromkeys(("staging_bytes", "logits_bytes", "loss_held_bytes"), 0.0),
        "held_params_bytes": 0.0,
        "micro_batches_in_flight": 1,
        "peak_bytes": peak,
    }
