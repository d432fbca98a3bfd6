"""Decoder-only GPT over tokens (byte-level by default).

Splits into pipeline stages by layers (toolkit.train.models.stages): the first stage holds
the embeddings, the last the final norm and the head; a stage between reads and returns
hidden states [batch, seq, dim].

With kernels="liger" (toolkit.kernels.liger) and targets, the head and the loss are one
fused, chunked kernel: the logits [batch, seq, vocab] are never built, and the loss comes
back directly. Without targets (inference, and the last pipeline stage, whose loss the
schedule computes from the stage's output), the head returns logits as before."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from toolkit.config.model import GPTConfig
from toolkit.kernels import liger
from toolkit.train.models.blocks import Block, LayerNorm, init_weights
from toolkit.train.models.stages import StagedModel


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (in float32 whatever the compute dtype). Logits sharded
    over the vocabulary (a DTensor, tensor parallelism) give a replicated DTensor loss under
    loss_parallel(): returned as a plain tensor, the same on every tp rank."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    return loss.to_local().clone() if isinstance(loss, DTensor) else loss


class GPT(StagedModel):
    INPUT = ("tok_emb", "pos_emb")
    OUTPUT = ("norm", "head")
    loss = staticmethod(gpt_loss)

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.dim)
        self.blocks = nn.ModuleDict(
            (str(i), Block(cfg.dim, cfg.num_heads, cfg.mlp_ratio, cfg.norm_eps))
            for i in range(cfg.num_layers)
        )
        self.norm = LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def reset_parameters(self) -> None:
        init_weights(self, self.cfg.init_std, self.cfg.num_layers)
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                m.reset_parameters()

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens (or, after the first stage, hidden states) in; logits, or the loss when
        `targets` are given, out (hidden states before the last stage)."""
        if self.tok_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(positions)
        x = self.run_blocks(x)
        if self.head is None:
            return x
        if targets is not None and self.kernels == "liger":
            return liger.fused_linear_cross_entropy(self.norm(x), self.head.weight, targets)
        logits = self.head(self.norm(x))
        # Tensor parallelism: logits are sharded over the vocabulary (a DTensor); the loss
        # (gpt_loss under loss_parallel, toolkit.distributed.tensor_parallel) is replicated.
        if targets is None:
            return logits.full_tensor() if isinstance(logits, DTensor) else logits
        return gpt_loss(logits, targets)

    @property
    def embedding_params(self) -> int:
        """Parameters used as lookups, not matmuls (excluded from the FLOP count)."""
        return self.cfg.vocab_size * self.cfg.dim + self.cfg.max_seq_len * self.cfg.dim
