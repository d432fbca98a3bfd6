"""Model shapes. GPT presets and a time-series transformer share one block design."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    kind: str = "gpt"  # gpt | timeseries
    name: str = "gpt_tiny"
    num_layers: int = 2
    dim: int = 64
    num_heads: int = 4
    mlp_ratio: float = 4.0
    vocab_size: int = 256  # gpt only: byte-level data needs >= 256
    max_seq_len: int = 256
    num_series: int = 0  # timeseries only: number of assets (input and output features)
    norm_eps: float = 1e-5
    init_std: float = 0.02

    KINDS = ("gpt", "timeseries")
