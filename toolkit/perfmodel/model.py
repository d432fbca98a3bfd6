"""The analytic performance model: pure arithmetic, no torch, no I/O.

Given a model shape, the batch, the precision, the FSDP2/HSDP layout and the hardware's peak
numbers, predict per optimizer step and per rank:

* FLOPs (model FLOPs from toolkit.train.flops, plus the recomputed forward under activation
  checkpointing),
* memory under FSDP2 (sharded fp32 parameters, gradients and AdamW state; unsharded
  all-gather buffers; gradient staging for the reduce-scatter; saved activations; the
  cross-entropy working set over the logits), as the larger of two phases — the start of
  backward and the optimizer step,
* communication bytes (all-gather in forward and, with reshard_after_forward, again in
  backward; reduce-scatter of gradients; for HSDP the all-reduce across replica groups),
* a roofline step time.

Overlap assumption: forward/backward runs at the roofline max(FLOPs / peak, bytes / bandwidth);
FSDP's collectives overlap with it, so they cost max(compute, communication); the optimizer
step is memory-bound and runs after backward, not overlapped. Data loading is assumed hidden
by prefetching (predicted data wait: 0).

    step_s = max(forward_backward_s, communication_s) + optimizer_s

Everything is per rank unless the name says `global`.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import ModelConfig
from toolkit.train.flops import block_params, flops_per_token, param_counts

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
def recompute_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Activation checkpointing recomputes each block's forward: 2 FLOPs per block parameter
    per token plus the forward third of the attention term (4 L d S)."""
    return 2.0 * model.num_layers * block_params(model.dim, model.mlp_ratio) + (
        4.0 * model.num_layers * model.dim * seq_len
    )


def flops(model: ModelConfig, layout: Layout) -> dict[str, float]:
    per_token = flops_per_token(model, layout.seq_len)
    tokens = layout.tokens_per_step
    recompute = (
        recompute_flops_per_token(model, layout.seq_len) if layout.activation_checkpointing else 0.0
    )
    return {
        "flops_per_token": per_token,
        "model_flops_per_step": per_token * tokens,
        "recompute_flops_per_step": recompute * tokens,
        "executed_flops_per_rank": (per_token + recompute) * tokens / layout.world_size,
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


def memory(model: ModelConfig, layout: Layout) -> dict[str, float]:
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
    backward_peak = params + optimizer + allgather + activations + max(logits, block_staging)
    block_grads = (total - root) * FP32 / shard
    end_of_backward_peak = params + optimizer + block_grads + root_staging
    optimizer_peak = params + grads + optimizer + params
    return {
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
        "peak_bytes": max(backward_peak, end_of_backward_peak, optimizer_peak),
    }


# -- communication -----------------------------------------------------------------------------
def communication(model: ModelConfig, layout: Layout) -> dict[str, float]:
    """Bytes each rank receives per optimizer step (ring algorithms: a rank receives
    (n-1)/n of the gathered or reduced buffer; all-reduce moves twice that)."""
    p_bytes = DTYPE_BYTES[layout.param_dtype]
    r_bytes = DTYPE_BYTES[layout.reduce_dtype]
    total = param_counts(model)["total"]
    block = block_params(model.dim, model.mlp_ratio)
    n = layout.shard_size
    frac = (n - 1) / n if n > 1 else 0.0
    # Forward: every unit is gathered once per micro-step. Backward (reshard_after_forward):
    # every block but the last (kept gathered) is gathered again; the root is not resharded.
    backward_gathered = (model.num_layers - 1) * block if layout.reshard_after_forward else 0
    allgather = layout.grad_accum * (total + backward_gathered) * p_bytes * frac
    # Gradients are reduced once per step (non-final micro-steps skip the reduce-scatter).
    reduce_scatter = total * r_bytes * frac
    r = layout.replicate
    cross = 2.0 * (r - 1) / r * total / n * r_bytes if r > 1 else 0.0
    within = allgather + reduce_scatter
    intra = within if layout.shard_within_node else 0.0
    inter = (0.0 if layout.shard_within_node else within) + cross
    return {
        "allgather_bytes": allgather,
        "reduce_scatter_bytes": reduce_scatter,
        "replica_allreduce_bytes": cross,
        "intra_node_bytes": intra,
        "inter_node_bytes": inter,
    }


# -- time --------------------------------------------------------------------------------------
def memory_traffic(model: ModelConfig, layout: Layout, mem: dict[str, float]) -> dict[str, float]:
    """Bytes moved through device memory per rank and step (a lower bound, as rooflines are).

    Forward/backward: parameters read once in forward and twice in backward per micro-step,
    saved activations written once and read once. Optimizer: AdamW reads parameter, gradient
    and both moments and writes parameter and both moments (7 fp32 words per parameter)."""
    p_bytes = DTYPE_BYTES[layout.param_dtype]
    total = param_counts(model)["total"]
    per_micro = 3 * total * p_bytes + 2 * mem["activations_bytes"]
    return {
        "forward_backward_bytes": layout.grad_accum * per_micro,
        "optimizer_bytes": 7 * FP32 * total / layout.shard_size,
    }


def roofline(
    flop: dict[str, float],
    traffic: dict[str, float],
    comm: dict[str, float],
    hw: HardwareConfig,
    param_dtype: str,
) -> dict[str, float | str]:
    compute_s = flop["executed_flops_per_rank"] / hw.peak_flops(param_dtype)
    fb_memory_s = traffic["forward_backward_bytes"] / hw.memory_bandwidth
    comm_s = (
        comm["intra_node_bytes"] / hw.intra_node_bandwidth
        + comm["inter_node_bytes"] / hw.inter_node_bandwidth
    )
    optimizer_s = traffic["optimizer_bytes"] / hw.memory_bandwidth
    forward_backward_s = max(compute_s, fb_memory_s)
    step_s = max(forward_backward_s, comm_s) + optimizer_s
    terms = {
        "compute": compute_s,
        "memory": fb_memory_s,
        "communication": comm_s,
        "optimizer": optimizer_s,
    }
    return {
        "compute_s": compute_s,
        "memory_s": fb_memory_s,
        "communication_s": comm_s,
        "optimizer_s": optimizer_s,
        "forward_backward_s": max(forward_backward_s, comm_s),
        "data_wait_s": 0.0,
        "step_s": step_s,
        "dominant": max(terms, key=lambda k: terms[k]),
    }


# Which measured phase of a StepRecord each model term lands in.
PHASE_OF_TERM = {
    "compute": "forward_backward_s",
    "memory": "forward_backward_s",
    "communication": "forward_backward_s",
    "optimizer": "optimizer_s",
}


@dataclass(frozen=True)
class Prediction:
    flops: dict[str, float]
    memory: dict[str, float]
    communication: dict[str, float]
    traffic: dict[str, float]
    time: dict[str, float | str]
    tokens_per_step: int
    world_size: int

    @property
    def step_s(self) -> float:
        return float(self.time["step_s"])

    @property
    def dominant(self) -> str:
        return str(self.time["dominant"])

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.step_s > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "flops": self.flops,
            "memory": self.memory,
            "communication": self.communication,
            "traffic": self.traffic,
            "time": self.time,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_s,
            "world_size": self.world_size,
        }


def predict(model: ModelConfig, layout: Layout, hw: HardwareConfig) -> Prediction:
    flop = flops(model, layout)
    mem = memory(model, layout)
    comm = communication(model, layout)
    traffic = memory_traffic(model, layout, mem)
    time = roofline(flop, traffic, comm, hw, layout.param_dtype)
    return Prediction(flop, mem, comm, traffic, time, layout.tokens_per_step, layout.world_size)
