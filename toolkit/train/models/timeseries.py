"""Causal transformer over multivariate series: reads [batch, time, num_series] and predicts
num_targets values (num_series when 0) at every position; trained with mean squared error.

Targets [batch, time, num_targets] are compared at every position (next-step prediction);
targets [batch, num_targets] (a window's target over a horizon, toolkit.data.samples) with
the last position's prediction. Missing targets (NaN) add no error to the loss.

Options (toolkit.config.model; all off by default, which is the model as it always was):
model.cross_section_norm standardises each input feature across instruments at every time
step (toolkit.kernels.masked_norm), model.loss / huber_delta / loss_weights pick the loss
(toolkit.kernels.masked_loss). The kernels follow model.kernels as resolved for the rank
(toolkit.kernels.liger.resolve, applied by toolkit.train.models.use_kernels): liger runs our
Triton kernels (a GPU, or TRITON_INTERPRET=1 on the CPU), torch the PyTorch references, and
auto picks liger only where CUDA runs the model, as for the GPT.

Splits into pipeline stages by layers like the GPT (toolkit.train.models.stages)."""

from __future__ import annotations

import torch
from torch import nn

from toolkit.config.model import TimeSeriesConfig, num_instruments
from toolkit.kernels.masked_loss import masked_regression_loss, masked_regression_loss_reference
from toolkit.kernels.masked_norm import (
    masked_cross_section_norm,
    masked_cross_section_norm_reference,
)
from toolkit.train.models.blocks import Block, LayerNorm, init_weights
from toolkit.train.models.stages import StagedModel


def masked_mse(pred: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The default loss; masked_regression_loss(kind="mse") without weights equals it."""
    if targets.dim() == 2:
        pred = pred[:, -1]
    # A missing target adds no error but still counts in the mean: the loss of a batch
    # then does not depend on how it is split over ranks and micro-steps.
    observed = torch.isfinite(targets)
    err = torch.where(observed, pred.float() - targets.float().nan_to_num(), 0.0)
    return (err * err).mean()


class TimeSeriesTransformer(StagedModel):
    INPUT = ("inp", "pos_emb")
    OUTPUT = ("norm", "head")

    def __init__(self, cfg: TimeSeriesConfig):
        super().__init__()
        self.cfg = cfg
        self.inp = nn.Linear(cfg.num_series, cfg.dim)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.dim)
        self.blocks = nn.ModuleDict(
            (str(i), Block(cfg.dim, cfg.num_heads, cfg.mlp_ratio, cfg.norm_eps))
            for i in range(cfg.num_layers)
        )
        self.norm = LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.num_targets or cfg.num_series)

    def reset_parameters(self) -> None:
        init_weights(self, self.cfg.init_std, self.cfg.num_layers)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.LayerNorm):
                m.reset_parameters()

    def loss(self, pred: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """model.loss over the last position (window targets) or every position; missing
        targets count in the mean (toolkit.kernels.masked_loss gives the formula)."""
        cfg = self.cfg
        if targets.dim() == 2:
            pred = pred[:, -1]
        weight = None
        if cfg.loss_weights:
            weight = torch.tensor(cfg.loss_weights, dtype=torch.float32, device=pred.device)
        fn = masked_regression_loss if self.kernels == "liger" else masked_regression_loss_reference
        return fn(pred, targets, weight, cfg.loss, cfg.huber_delta)

    def normalise_cross_section(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, time, instruments * features] standardised across instruments per feature.
        The loader writes a missing input as exactly 0 (toolkit.data.loader.Windows.batch), so
        an exact 0 (or a NaN) counts as missing here and stays 0."""
        n = num_instruments(self.cfg)
        cells = x.unflatten(-1, (n, x.shape[-1] // n))
        mask = torch.isfinite(cells) & (cells != 0)
        norm = (
            masked_cross_section_norm
            if self.kernels == "liger"
            else masked_cross_section_norm_reference
        )
        return norm(cells, mask, self.cfg.norm_eps).flatten(-2)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.inp is not None:
            if self.cfg.cross_section_norm:
                x = self.normalise_cross_section(x)
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.inp(x) + self.pos_emb(positions)
        x = self.run_blocks(x)
        if self.head is None:
            return x
        pred = self.head(self.norm(x))
        return pred if targets is None else self.loss(pred, targets)

    @property
    def embedding_params(self) -> int:
        return self.cfg.max_seq_len * self.cfg.dim
