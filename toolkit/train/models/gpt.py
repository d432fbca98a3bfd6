"""Decoder-only GPT over tokens (byte-level by default)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from toolkit.config.model import ModelConfig
from toolkit.train.models.blocks import Block, init_weights


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.dim)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.num_heads, cfg.mlp_ratio, cfg.norm_eps)
            for _ in range(cfg.num_layers)
        )
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def reset_parameters(self) -> None:
        init_weights(self, self.cfg.init_std, self.cfg.num_layers)
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                m.reset_parameters()

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        # Tensor parallelism: logits are sharded over the vocabulary (a DTensor); the loss
        # (under loss_parallel, toolkit.distributed.tensor_parallel) is replicated.
        if targets is None:
            return logits.full_tensor() if isinstance(logits, DTensor) else logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return loss.to_local().clone() if isinstance(loss, DTensor) else loss

    @property
    def embedding_params(self) -> int:
        """Parameters used as lookups, not matmuls (excluded from the FLOP count)."""
        return self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
