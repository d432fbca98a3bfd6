"""Model builders: a dict from ModelConfig.kind to constructor is all the registry we need."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from toolkit.config.model import ModelConfig
from toolkit.train.models.gpt import GPT
from toolkit.train.models.timeseries import TimeSeriesTransformer

BUILDERS: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "gpt": GPT,
    "timeseries": TimeSeriesTransformer,
}


def build_model(cfg: ModelConfig) -> nn.Module:
    return BUILDERS[cfg.kind](cfg)
