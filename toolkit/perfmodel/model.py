"""The analytic performance model: pure arithmetic, no torch, no I/O.

Given a model shape, the batch, the precision, the FSDP2/HSDP layout and a hardware profile
(peaks plus achievable fractions, links, latencies), predict per optimizer step and per rank:

* FLOPs: model FLOPs (PaLM convention, for MFU) and executed FLOPs (causal attention runs
  about half of full attention; the recomputed forward under activation checkpointing), HFU;
* memory under FSDP2 as the largest of three moments (start of backward, end of backward,
  optimizer step), including the unsharded gradients FSDP2 keeps across micro-steps when
  grad_accum > 1; a layout whose peak exceeds the device memory "does not fit";
* communication (toolkit.perfmodel.comm): bytes, calls, latency, rails, exposure;
* time by term (toolkit.perfmodel.kernels): GEMMs at their shape's achievable rate, causal
  attention, non-GEMM kernels by bytes, per-op overhead, exposed communication, optimizer.

    step_s = gemm + attention + elementwise + overhead + exposed communication + optimizer

Everything is per rank unless the name says `global`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import ModelConfig
from toolkit.perfmodel import comm as comm_model
from toolkit.perfmodel import kernels
from toolkit.train.flops import block_params, flops_per_token, matmul_params, param_counts

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4
ADAM_STATES = 2  # exp_avg, exp_avg_sq (fp32, sharded like the parameters)
CE_BYTES_PER_LOGIT = 12  # fp32 log-softmax output + its gradient + the input gradient


@dataclass(frozen=True)
class Layout:
    """How the job is laid out over ranks and what each micro-step computes."""

    world_size: int
    ranks_per_node: int
    micro_batch_size: int  # sequences per rank per micro-step
    grad_accum: int
    seq_len: int
    param_dtype: str = "float32"
    reduce_dtype: str = "float32"
    replicate: int = 1  # HSDP replica groups; 1 = plain FSDP
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False

    @property
    def shard_size(self) -> int:
        return self.world_size // self.replicate

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all ranks."""
        return self.micro_batch_size * self.grad_accum * self.world_size * self.seq_len

    @property
    def shard_within_node(self) -> bool:
        return self.shard_size <= self.ranks_per_node


# -- FLOPs -------------------------------------------------------------------------------------
def executed_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """FLOPs the kernels execute per token, forward + backward: 6 per matmul parameter plus
    causal attention, about half of full attention's 12*L*d*S."""
    return 6.0 * matmul_params(model) + 0.5 * 12.0 * model.num_layers * model.dim * seq_len


def causal_recompute_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """The recomputed forward as executed: 2 per block parameter + half of 4*L*d*S."""
    return 2.0 * model.num_layers * block_params(model.dim, model.mlp_ratio) + (
        0.5 * 4.0 * model.num_layers * model.dim * seq_len
    )


def flops(model: ModelConfig, layout: Layout) -> dict[str, float]:
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


# -- memory ------------------------------------------------------------------------------------
def block_activation_units(mlp_ratio: float) -> float:
    """Tensors one block saves for backward, in batch*seq*dim elements of the compute dtype:

    norm1 input 1, norm1 output 1, q/k/v 3, attention output 1, its contiguous copy (proj
    input) 1, norm2 input 1, norm2 output 1, fc output r, GELU output r  ->  9 + 2r (17 at r=4).
    Flash/efficient attention keeps no seq x seq matrix; LayerNorm statistics are negligible."""
    return 9.0 + 2.0 * mlp_ratio


def root_params(model: ModelConfig) -> int:
    """Parameters owned by the root FSDP unit: embeddings, final norm, head."""
    counts = param_counts(model)
    return counts["embedding"] + counts["head"]


def output_width(model: ModelConfig) -> int:
    return model.vocab_size if model.kind == "gpt" else (model.num_targets or model.num_series)


def memory(
    model: ModelConfig, layout: Layout, capacity_bytes: float = float("inf")
) -> dict[str, Any]:
    """Bytes per rank. Sharded state is fp32 (the model is built in fp32; FSDP2 keeps the
    sharded parameters in their original dtype and casts to param_dtype for compute)."""
    p_bytes = DTYPE_BYTES[layout.param_dtype]
    r_bytes = DTYPE_BYTES[layout.reduce_dtype]
    total = param_counts(model)["total"]
    shard = layout.shard_size
    block = block_params(model.dim, model.mlp_ratio)
    root = root_params(model)

    params = total * FP32 / shard
    grads = total * FP32 / shard
    optimizer = ADAM_STATES * total * FP32 / shard
    # Unsharded parameters in compute dtype while computing: the root unit (it spans the whole
    # forward and, as FSDP2's root, is not resharded after forward) plus the current block and
    # the one prefetched. Without reshard_after_forward every block stays gathered until its
    # backward.
    gathered_blocks = 2 if layout.reshard_after_forward else model.num_layers
    allgather = (root + min(gathered_blocks, model.num_layers) * block) * p_bytes
    # Gradient staging: a unit's unsharded gradient in compute dtype plus its reduce_dtype
    # reduce-scatter input (FSDP2 reshards the unit's parameters before reducing).
    block_staging = block * (p_bytes + r_bytes)
    root_staging = root * (p_bytes + r_bytes)

    tokens = layout.micro_batch_size * layout.seq_len  # one micro-step on this rank
    unit = tokens * model.dim * p_bytes
    per_block = block_activation_units(model.mlp_ratio) * unit
    if layout.activation_checkpointing:
        # Only each block's input is kept; one block is rematerialised at a time in backward.
        activations = model.num_layers * unit + per_block
    else:
        activations = model.num_layers * per_block
    activations += 2 * unit  # final norm input and output (head input)
    logits = tokens * output_width(model) * CE_BYTES_PER_LOGIT

    # Peak candidates (the largest is the peak):
    # - backward, first blocks: saved activations all alive, plus either the loss working
    #   set (just before) or the first block's gradient staging (just after);
    # - end of backward: activations gone, the blocks' sharded gradients and the root unit's
    #   gradient staging (the root is reduced last; the largest unit for big vocabularies);
    # - optimizer step: gradients still alive (zero_grad(set_to_none=True) frees them after
    #   the step); foreach AdamW holds about one parameter-shard-sized temporary.
    # With grad_accum > 1 FSDP2 keeps every unit's unsharded gradient (in reduce_dtype) from
    # the first micro-step until the final one reduces it.
    accumulated = total * r_bytes if layout.grad_accum > 1 else 0.0
    backward_peak = (
        params + optimizer + allgather + activations + accumulated + max(logits, block_staging)
    )
    block_grads = (total - root) * FP32 / shard
    end_of_backward_peak = params + optimizer + block_grads + root_staging
    optimizer_peak = params + grads + optimizer + params
    terms = {
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": optimizer,
        "allgather_bytes": allgather,
        "accumulated_grads_bytes": accumulated,
        "activations_bytes": activations,
        "logits_bytes": logits,
    }
    peak = max(backward_peak, end_of_backward_peak, optimizer_peak)
    return {
        "accumulated_grads_bytes": accumulated,
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
        "state_bytes": params + grads + optimizer,
        "backward_peak_bytes": backward_peak,
        "end_of_backward_peak_bytes": end_of_backward_peak,
        "optimizer_peak_bytes": optimizer_peak,
        "peak_bytes": peak,
    }


# -- time --------------------------------------------------------------------------------------
def communication(model: ModelConfig, layout: Layout) -> dict[str, float]:
    """Bytes and calls per rank and step (see toolkit.perfmodel.comm), split by link."""
    c = comm_model.communication(
        model,
        shard_size=layout.shard_size,
        replicate=layout.replicate,
        grad_accum=layout.grad_accum,
        param_dtype=layout.param_dtype,
        reduce_dtype=layout.reduce_dtype,
        reshard_after_forward=layout.reshard_after_forward,
    )
    within = c["allgather_bytes"] + c["reduce_scatter_bytes"]
    c["intra_node_bytes"] = within if layout.shard_within_node else 0.0
    c["inter_node_bytes"] = (0.0 if layout.shard_within_node else within) + c[
        "replica_allreduce_bytes"
    ]
    return c


def fsdp_unit_collectives(model: ModelConfig, layout: Layout) -> int:
    """Unit all-gathers and reduce-scatters FSDP2 runs per step, whatever the world size
    (copy-in/copy-out happen even on one rank)."""
    units = model.num_layers + 1
    regathered = model.num_layers - 1 if layout.reshard_after_forward else 0
    return layout.grad_accum * (units + regathered) + units


def step_time(
    model: ModelConfig,
    layout: Layout,
    hw: HardwareConfig,
    comm: dict[str, float],
) -> dict[str, float | str]:
    """Seconds per step by term; `forward_backward_s` and `optimizer_s` are the phases a step
    record measures."""
    tokens = layout.micro_batch_size * layout.seq_len
    width = output_width(model)
    dtype = layout.param_dtype
    act_bytes = DTYPE_BYTES[dtype]
    ac = layout.activation_checkpointing
    speed = kernels.rank_speed(hw, layout.ranks_per_node)
    slowdown = kernels.overhead_slowdown(hw, layout.ranks_per_node)
    accum = layout.grad_accum
    gemm_s = accum * kernels.gemm_time(model, tokens, width, dtype, hw, ac) / speed
    attention_s = accum * kernels.attention_time(model, tokens, layout.seq_len, dtype, hw, ac)
    attention_s /= speed
    elementwise_bw = hw.memory_bandwidth * hw.elementwise_fraction * speed
    elementwise_s = accum * kernels.elementwise_bytes(model, tokens, width, act_bytes, ac)
    elementwise_s /= elementwise_bw
    overhead_s = slowdown * (
        accum * kernels.ops_per_micro_step(model, ac) * hw.op_overhead_s
        + fsdp_unit_collectives(model, layout) * hw.fsdp_collective_overhead_s
    )
    compute_s = gemm_s + attention_s + elementwise_s + overhead_s
    link = comm_model.links(hw, layout.shard_size, layout.ranks_per_node)
    ct = comm_model.communication_time(comm, link, compute_s, hw.comm_overlap)
    local_params = param_counts(model)["total"] / layout.shard_size
    optimizer_s = (
        kernels.optimizer_bytes(local_params) / (hw.memory_bandwidth * speed)
        + kernels.optimizer_ops(model) * hw.optimizer_op_overhead_s * slowdown
        + ct["small_allreduce_s"]
    )
    forward_backward_s = compute_s + ct["exposed_s"]
    terms = {
        "gemm": gemm_s,
        "attention": attention_s,
        "elementwise": elementwise_s,
        "overhead": overhead_s,
        "communication": ct["exposed_s"],
        "optimizer": optimizer_s,
    }
    return {
        **{f"{k}_s": v for k, v in terms.items()},
        "compute_s": compute_s,
        "communication_total_s": ct["total_s"],
        "first_allgather_s": ct["first_allgather_s"],
        "last_reduce_scatter_s": ct["last_reduce_scatter_s"],
        "forward_backward_s": forward_backward_s,
        "data_wait_s": 0.0,
        "step_s": forward_backward_s + optimizer_s,
        "uncertainty": hw.uncertainty,
        "dominant": max(terms, key=lambda k: terms[k]),
    }


# Which measured phase of a StepRecord each model term lands in.
PHASE_OF_TERM = {
    "gemm": "forward_backward_s",
    "attention": "forward_backward_s",
    "elementwise": "forward_backward_s",
    "overhead": "forward_backward_s",
    "communication": "forward_backward_s",
    "optimizer": "optimizer_s",
}
TERMS = tuple(PHASE_OF_TERM)


@dataclass(frozen=True)
class Prediction:
    flops: dict[str, float]
    memory: dict[str, Any]
    communication: dict[str, float]
    time: dict[str, float | str]
    tokens_per_step: int
    world_size: int

    @property
    def fits(self) -> bool:
        return bool(self.memory["fits"])

    @property
    def step_s(self) -> float:
        return float(self.time["step_s"])

    @property
    def dominant(self) -> str:
        return str(self.time["dominant"])

    @property
    def tokens_per_s(self) -> float:
        """0 for a layout that does not fit: it has no throughput."""
        return self.tokens_per_step / self.step_s if self.fits and self.step_s > 0 else 0.0

    def step_range_s(self) -> tuple[float, float]:
        """The step time's range under the hardware profile's stated uncertainty."""
        u = float(self.time["uncertainty"])
        return self.step_s / (1 + u), self.step_s * (1 + u)

    def utilisation(self, peak_flops: float) -> dict[str, float]:
        """MFU (model FLOPs) and HFU (executed FLOPs, recompute included) against a peak."""
        if not self.fits or self.step_s <= 0:
            return {"mfu": 0.0, "hfu": 0.0}
        denominator = self.step_s * self.world_size * peak_flops
        return {
            "mfu": self.flops["model_flops_per_step"] / denominator,
            "hfu": self.flops["executed_flops_per_step"] / denominator,
        }

    def does_not_fit(self) -> str:
        """'' when it fits, else one line: the peak, the capacity and the largest term."""
        if self.fits:
            return ""
        m = self.memory
        term = str(m["largest_term"])
        return (
            f"does not fit: peak {m['peak_bytes'] / 2**30:,.2f} GiB > "
            f"{m['capacity_bytes'] / 2**30:,.2f} GiB per device; largest term "
            f"{term.removesuffix('_bytes')} {m[term] / 2**30:,.2f} GiB"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "flops": self.flops,
            "memory": self.memory,
            "communication": self.communication,
            "time": self.time,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_s,
            "world_size": self.world_size,
            "fits": self.fits,
        }


def device_capacity(hw: HardwareConfig, ranks_per_node: int) -> float:
    """Memory one rank may use: the device's, or on CPU the node's RAM shared by its ranks."""
    return hw.memory_bytes / ranks_per_node if hw.cores_per_node > 0 else hw.memory_bytes


def predict(model: ModelConfig, layout: Layout, hw: HardwareConfig) -> Prediction:
    flop = flops(model, layout)
    mem = memory(model, layout, device_capacity(hw, layout.ranks_per_node))
    comm = communication(model, layout)
    time = step_time(model, layout, hw, comm)
    return Prediction(flop, mem, comm, time, layout.tokens_per_step, layout.world_size)
