"""The analytic performance model: pure arithmetic, no torch, no I/O.

Given a model shape, the batch, the precision, the layout (FSDP2/HSDP over dp_replicate x
dp_shard, tensor parallelism tp, pipeline parallelism pp and its schedule) and a hardware
profile (peaks plus achievable fractions, links, latencies), predict per optimizer step and
per rank:

* FLOPs: model FLOPs (PaLM convention, for MFU) and executed FLOPs (causal attention runs
  about half of full attention; the recomputed forward under activation checkpointing), HFU;
* memory (toolkit.perfmodel.memory) per pipeline rank as the largest of three moments
  (start of backward, end of backward, optimizer step), including the unsharded gradients
  FSDP2 keeps across micro-steps when grad_accum > 1; a layout whose peak exceeds the device
  memory "does not fit";
* communication (toolkit.perfmodel.comm, tp, pipeline): bytes, calls, latency, rails,
  exposure;
* time by term (toolkit.perfmodel.steptime over kernels): GEMMs at their shape's achievable
  rate, causal attention, non-GEMM kernels by bytes, per-op overhead, exposed communication,
  optimizer, tensor-parallel collectives, pipeline sends and bubble.

    step_s = gemm + attention + elementwise + overhead + exposed communication + optimizer
             + tp_communication + pipeline_p2p + pipeline_bubble

Everything is per rank unless the name says `global`.
"""

from __future__ import annotations

from typing import Any

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import TransformerConfig
from toolkit.perfmodel import pipeline
from toolkit.perfmodel.comm import DTYPE_BYTES
from toolkit.perfmodel.counted_model import CountedShape, predict_counted
from toolkit.perfmodel.layout import Layout
from toolkit.perfmodel.memory import block_activation_units, memory, output_width
from toolkit.perfmodel.prediction import Prediction, device_capacity
from toolkit.perfmodel.steptime import communication, fsdp_unit_collectives, step_time
from toolkit.train.flops import block_params, flops_per_token, matmul_params

__all__ = [
    "Layout",
    "DTYPE_BYTES",
    "Prediction",
    "block_activation_units",
    "communication",
    "flops",
    "fsdp_unit_collectives",
    "memory",
    "output_width",
    "predict",
    "step_time",
]


# -- FLOPs -------------------------------------------------------------------------------------
def executed_flops_per_token(model: TransformerConfig, seq_len: int) -> float:
    """FLOPs the kernels execute per token, forward + backward: 6 per matmul parameter plus
    causal attention, about half of full attention's 12*L*d*S."""
    return 6.0 * matmul_params(model) + 0.5 * 12.0 * model.num_layers * model.dim * seq_len


def causal_recompute_flops_per_token(model: TransformerConfig, seq_len: int) -> float:
    """The recomputed forward as executed: 2 per block parameter + half of 4*L*d*S."""
    return 2.0 * model.num_layers * block_params(model.dim, model.mlp_ratio) + (
        0.5 * 4.0 * model.num_layers * model.dim * seq_len
    )


def flops(model: TransformerConfig, layout: Layout) -> dict[str, float]:
    """Model FLOPs (PaLM: full attention, no recompute; what MFU counts) and executed FLOPs
    (causal attention, recompute included; what HFU counts)."""
    per_token = flops_per_token(model, layout.seq_len)
    tokens = layout.tokens_per_step
    recompute = (
        causal_recompute_flops_per_token(model, layout.seq_len)
        if layout.activation_checkpointing
        else 0.0
    )
    executed = executed_flops_per_token(model, layout.seq_len) + recompute
    return {
        "flops_per_token": per_token,
        "model_flops_per_step": per_token * tokens,
        "recompute_flops_per_step": recompute * tokens,
        "executed_flops_per_step": executed * tokens,
        "executed_flops_per_rank": executed * tokens / layout.world_size,
    }


# Which measured phase of a StepRecord each model term lands in.
PHASE_OF_TERM = {
    "gemm": "forward_backward_s",
    "attention": "forward_backward_s",
    "elementwise": "forward_backward_s",
    "overhead": "forward_backward_s",
    "fsdp_copy": "forward_backward_s",
    "communication": "forward_backward_s",
    "optimizer": "optimizer_s",
    "tp_communication": "forward_backward_s",
    "pipeline_p2p": "forward_backward_s",
    "pipeline_bubble": "forward_backward_s",
}
TERMS = tuple(PHASE_OF_TERM)


def predict(model: TransformerConfig | Any, layout: Layout, hw: HardwareConfig) -> Prediction:
    """The prediction for a built-in transformer's shape, or for a model of yours from its
    counted costs (a toolkit.perfmodel.counted_model.CountedShape)."""
    if isinstance(model, CountedShape):
        return predict_counted(model, layout, hw)
    stages = pipeline.layout_stages(model, layout, hw)
    flop = flops(model, layout)
    mem = memory(model, layout, device_capacity(hw, layout.ranks_per_node), stages)
    comm = communication(model, layout, stages)
    time = step_time(model, layout, hw, stages)
    return Prediction(flop, mem, comm, time, layout.tokens_per_step, layout.world_size)
