"""Memory options the performance model accounts for (pure arithmetic): the fused
linear + cross-entropy loss (`model.kernels=liger`) and low-bit optimizer states
(`optim.name`).

Optimizer states: ONE table, bytes per parameter, with where each number comes from. The
optimizer module decides which library and format each name runs (toolkit.train.lowbit's
FORMATS); tests/perfmodel/test_memory_options.py holds this table to it name by name.

Fused cross-entropy: without it the head's logits [tokens, vocab] are materialised and the
loss keeps an fp32 log-softmax, its gradient and the input's gradient (12 B per logit,
memory.CE_BYTES_PER_LOGIT). Liger's fused linear cross-entropy
(liger_kernel/ops/fused_linear_cross_entropy.py) never holds more than a chunk of logits:
it walks the tokens in chunks of `chunk_tokens`, computes each chunk's logits in the input's
dtype, overwrites them with their gradient in place and accumulates the input's gradient
[tokens, dim] and the head weight's gradient [vocab, dim] (both in the input's / the
weight's dtype) during the forward; backward only returns them. So the loss keeps:

    chunk   = chunk_tokens x vocab x compute bytes         (transient, one at a time)
    held    = tokens x dim x compute bytes                  (grad_input, until backward)
            + vocab x dim x compute bytes                   (grad_weight, until backward)
"""

from __future__ import annotations

import math

# Bytes of optimizer state per parameter, by optim.name; (bytes, source).
OPTIMIZER_STATE_BYTES: dict[str, tuple[float, str]] = {
    "adamw": (
        2 * 4.0,
        "torch.optim.AdamW: exp_avg and exp_avg_sq in fp32 (the parameters' dtype)",
    ),
    "adamw8bit": (
        2 * (1.0 + 4.0 / 256),
        "torchao.optim.AdamW8bit: two int8 states + one fp32 scale per block of 256 "
        "(block_size=256) per state; tensors under 4096 elements keep fp32 states (negligible)",
    ),
    "adamw_lowmem": (
        2 * (0.5 + 4.0 / 128),
        "torchao.optim.AdamW4bit: two 4-bit states (two codes per byte) + one fp32 scale "
        "per block of 128 (block_size=128) per state",
    ),
}

# Liger's chunk budget: chunk logits bounded by CHUNK_MEM_CONST x tokens x dim elements
# (liger_kernel _CHUNK_MEM_CONST = 1 in liger-kernel 0.8.5).
LIGER_CHUNK_MEM_CONST = 1


def optimizer_state_bytes_per_param(name: str) -> float:
    """Bytes of optimizer state per parameter for optim.name `name`."""
    if name not in OPTIMIZER_STATE_BYTES:
        known = ", ".join(OPTIMIZER_STATE_BYTES)
        raise ValueError(f"optimizer {name!r}: no state size in the performance model ({known})")
    return OPTIMIZER_STATE_BYTES[name][0]


def fused_cross_entropy(kernels: str, token_inputs: bool = True) -> bool:
    """Whether the loss runs fused: model.kernels=liger on the GPT (the time-series model's
    loss is not a cross-entropy). `auto` counts as torch: it falls back to torch where Liger
    or a GPU is missing, and the memory estimate must not bet on the smaller number."""
    return kernels == "liger" and token_inputs


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))


def chunk_tokens(tokens: int, vocab: int, dim: int) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy (its own formula): the chunk's
    logits stay within about tokens x dim elements."""
    inc_factor = -(-vocab // (LIGER_CHUNK_MEM_CONST * dim))
    return min(next_power_of_2(-(-tokens // inc_factor)), tokens)


def fused_loss_bytes(tokens: int, vocab: int, dim: int, compute_bytes: int) -> dict[str, float]:
    """What the fused loss keeps on one rank: `chunk` (transient logits, reused for their
    gradient) and `held` (grad_input and grad_weight, alive from the forward to the end of
    the head's backward)."""
    return {
        "chunk": chunk_tokens(tokens, vocab, dim) * vocab * compute_bytes,
        "held": (tokens * dim + vocab * dim) * compute_bytes,
    }
