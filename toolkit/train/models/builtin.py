"""The two built-in models as specs: the GPT over tokens and the time-series transformer.

Both shard by transformer block, initialise with their own reset_parameters, take (inputs,
targets) pairs with `forward(inputs, targets)` returning the loss, split into pipeline
stages by layers, and count their FLOPs analytically (toolkit.train.flops). The GPT also has
a tensor-parallel plan; the time-series model's predictions feed the rank-IC eval metric.
"""

from __future__ import annotations

import torch
from torch import nn

from toolkit.distributed.tensor_parallel import apply_tensor_parallel
from toolkit.train.flops import flops_per_token
from toolkit.train.models.gpt import GPT
from toolkit.train.models.spec import Batch, ModelSpec
from toolkit.train.models.timeseries import TimeSeriesTransformer


def blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.blocks.values())


def reset(model: nn.Module) -> None:
    model.reset_parameters()


def predictions(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = batch
    return model(inputs), targets


def transformer_flops(cfg, seq_len: int) -> float:
    return flops_per_token(cfg, seq_len) * seq_len


GPT_SPEC = ModelSpec(
    name="gpt",
    build=GPT,
    units=blocks,
    init=reset,
    tensor_parallel=apply_tensor_parallel,
    pipeline=True,
    flops_per_sample=transformer_flops,
    unit="tokens",
)
TIMESERIES_SPEC = ModelSpec(
    name="timeseries",
    build=TimeSeriesTransformer,
    units=blocks,
    init=reset,
    predict=predictions,
    pipeline=True,
    flops_per_sample=transformer_flops,
    unit="samples",
)
