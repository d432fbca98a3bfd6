"""FLOP and MFU arithmetic (pure functions, unit-tested by hand-computed values).

Model FLOPs per token follow PaLM (Chowdhery et al. 2022, appendix B):

    flops_per_token = 6 * N + 12 * L * d * S

N: parameters that take part in matmuls (all parameters minus embedding lookups), L: layers,
d: model width, S: sequence length. The 6 is 2 (multiply-add) x 3 (forward + backward);
12*L*d*S is the attention score and value matmuls. Activation recomputation is *not* counted
(MFU, not HFU).

    MFU = tokens_per_s * flops_per_token / (peak_flops_per_device * num_devices)
"""

from __future__ import annotations

from toolkit.config.model import TransformerConfig


def block_params(dim: int, mlp_ratio: float) -> int:
    hidden = int(dim * mlp_ratio)
    attention = 3 * dim * dim + dim * dim  # qkv + output projection, no biases
    mlp = 2 * dim * hidden  # fc + proj, no biases
    norms = 2 * 2 * dim  # two LayerNorms (weight + bias)
    return attention + mlp + norms


def param_counts(cfg: TransformerConfig) -> dict[str, int]:
    """Parameter counts by part: {'embedding', 'blocks', 'head', 'total'}."""
    d = cfg.dim
    blocks = cfg.num_layers * block_params(d, cfg.mlp_ratio)
    final_norm = 2 * d
    if cfg.token_inputs:  # token and position embeddings: lookups
        embedding = cfg.vocab_size * d + cfg.max_seq_len * d
        head = d * cfg.vocab_size + final_norm
    else:  # timeseries: linear input projection is a matmul, positions are a lookup
        embedding = cfg.max_seq_len * d
        out = cfg.num_targets or cfg.num_series
        head = (cfg.num_series * d + d) + (d * out + out) + final_norm
    return {
        "embedding": embedding,
        "blocks": blocks,
        "head": head,
        "total": embedding + blocks + head,
    }


def matmul_params(cfg: TransformerConfig) -> int:
    counts = param_counts(cfg)
    return counts["total"] - counts["embedding"]


def flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    return 6.0 * matmul_params(cfg) + 12.0 * cfg.num_layers * cfg.dim * seq_len


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float, num_devices: int) -> float:
    """Model FLOPs utilisation in [0, 1] (can exceed 1 if the configured peak is too low)."""
    if peak_flops <= 0 or num_devices <= 0:
        return 0.0
    return tokens_per_s * flops_per_tok / (peak_flops * num_devices)
