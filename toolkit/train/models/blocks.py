"""The transformer block shared by every model here (pre-norm, causal attention, GELU MLP).

Its LayerNorms (and the models' final norms) run Liger's kernel when the model's kernels are
"liger" (`use_kernels`, toolkit.kernels.liger); the parameters and state-dict keys are
nn.LayerNorm's either way, so checkpoints move between kernels=torch and kernels=liger.

The attention's fused input projection `qkv_heads` is laid out head by head: rows
[h*3*hd, (h+1)*3*hd) hold head h's query, key and value (hd = dim / num_heads). A split of
its rows into tp equal parts (tensor parallelism's column-wise Shard(0)) therefore gives
each rank whole heads with their q, k and v; the head count is read from the local tensor's
width, never from the global dim, so the same code runs sharded and unsharded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from toolkit.kernels import liger


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm that runs Liger's LayerNorm kernel when `kernels` is "liger"."""

    kernels = "torch"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels == "liger":
            return liger.layer_norm(x, self.weight, self.bias, self.eps)
        return super().forward(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv_heads = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_heads(x)  # [batch, seq, 3 * local heads * head_dim]
        batch, seq, width = qkv.shape
        heads = width // (3 * self.head_dim)  # num_heads / tp under tensor parallelism
        q, k, v = qkv.view(batch, seq, heads, 3, self.head_dim).unbind(dim=3)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, heads, seq, head_dim]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(dim, hidden, bias=False)
        self.proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """One transformer layer. `activation_checkpointing` recomputes it in backward; the
    state-dict keys stay the same either way (checkpoints move between settings)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, eps: float):
        super().__init__()
        self.norm1 = LayerNorm(dim, eps=eps)
        self.attn = CausalSelfAttention(dim, num_heads)
        self.norm2 = LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, int(dim * mlp_ratio))
        self.activation_checkpointing = False

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


def init_weights(module: nn.Module, std: float, num_layers: int) -> None:
    """GPT-2 initialisation: normal(0, std); residual projections scaled by 1/sqrt(2L)."""
    for name, p in module.named_parameters():
        if p.dim() < 2:
            continue
        scale = (2 * num_layers) ** -0.5 if name.endswith("proj.weight") else 1.0
        nn.init.normal_(p, mean=0.0, std=std * scale)
