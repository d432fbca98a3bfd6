"""The quant benchmark's three model families at two sizes each: an LSTM, a TCN and a small
transformer (the built-in ts_transformer). Each reads [batch, lookback, width] and returns
one prediction per window, [batch].

The LSTM's recurrence is written out (the input projection for every step at once, then one
matmul per step for the hidden state): torch's nn.LSTM runs one fused kernel (cuDNN on a
GPU) for which vmap has no batching rule, so an ensemble could not batch its members; the
same written-out LSTM serves the single model, so the two compare like for like.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from toolkit.config.model import TimeSeriesConfig
from toolkit.train.models.timeseries import TimeSeriesTransformer


class LSTM(nn.Module):
    def __init__(self, width: int, hidden: int, layers: int):
        super().__init__()
        self.hidden = hidden
        self.inputs = nn.ModuleList(
            nn.Linear(width if i == 0 else hidden, 4 * hidden) for i in range(layers)
        )
        self.recurrent = nn.ModuleList(
            nn.Linear(hidden, 4 * hidden, bias=False) for _ in range(layers)
        )
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for inp, rec in zip(self.inputs, self.recurrent, strict=True):
            gates_in = inp(x)  # [B, T, 4H]: every step's input projection at once
            h = x.new_zeros(x.shape[0], self.hidden)
            c = torch.zeros_like(h)
            outputs = []
            # unbind once: indexing each step would make backward fill a full-size
            # gradient per step (quadratic in the lookback)
            for step in gates_in.unbind(1):
                i, f, g, o = (step + rec(h)).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            x = torch.stack(outputs, dim=1)
        return self.head(x[:, -1]).squeeze(-1)


class TCN(nn.Module):
    """Residual blocks of two causal dilated convolutions (dilation 1, 2, 4, ...)."""

    def __init__(self, width: int, channels: int, blocks: int, kernel: int = 3):
        super().__init__()
        self.inp = nn.Conv1d(width, channels, 1)
        self.kernel = kernel
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=2 ** (i // 2)) for i in range(2 * blocks)
        )
        self.head = nn.Linear(channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x.transpose(1, 2))  # [B, C, T]
        for i in range(0, len(self.convs), 2):
            y = x
            for conv in self.convs[i : i + 2]:
                pad = (self.kernel - 1) * conv.dilation[0]
                y = torch.relu(conv(nn.functional.pad(y, (pad, 0))))
            x = x + y
        return self.head(x[:, :, -1]).squeeze(-1)


class Transformer(nn.Module):
    """The built-in ts_transformer with one target, read at the last position."""

    def __init__(self, width: int, dim: int, layers: int, heads: int, lookback: int):
        super().__init__()
        cfg = TimeSeriesConfig(
            num_series=width,
            num_targets=1,
            dim=dim,
            num_layers=layers,
            num_heads=heads,
            max_seq_len=lookback,
        )
        self.model = TimeSeriesTransformer(cfg)
        self.model.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[:, -1, 0]


@dataclass(frozen=True)
class Family:
    name: str
    sizes: dict[str, dict[str, int]]  # size name -> the builder's keyword arguments
    build: Callable[..., nn.Module]  # (width, lookback, **size) -> module


FAMILIES = {
    "lstm": Family(
        "lstm",
        {"small": {"hidden": 32, "layers": 1}, "medium": {"hidden": 128, "layers": 2}},
        lambda width, lookback, **size: LSTM(width, **size),
    ),
    "tcn": Family(
        "tcn",
        {"small": {"channels": 32, "blocks": 3}, "medium": {"channels": 64, "blocks": 5}},
        lambda width, lookback, **size: TCN(width, **size),
    ),
    "transformer": Family(
        "transformer",
        {
            "small": {"dim": 64, "layers": 2, "heads": 4},
            "medium": {"dim": 128, "layers": 4, "heads": 8},
        },
        lambda width, lookback, **size: Transformer(width, lookback=lookback, **size),
    ),
}
SIZES = ("small", "medium")


def build(family: str, size: str, width: int, lookback: int) -> nn.Module:
    return FAMILIES[family].build(width, lookback, **FAMILIES[family].sizes[size])


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
