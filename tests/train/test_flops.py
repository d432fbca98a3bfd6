"""FLOP and MFU arithmetic, checked against numbers computed by hand."""

from __future__ import annotations

import pytest

from toolkit.config.model import GPTConfig, TimeSeriesConfig
from toolkit.train.flops import flops_per_token, mfu, param_counts


def test_gpt_tiny_params_by_hand() -> None:
    cfg = GPTConfig(kind="gpt", num_layers=2, dim=64, num_heads=4, vocab_size=256, max_seq_len=256)
    # block: qkv 3*64*64 = 12288, out proj 4096, mlp 2*64*256 = 32768, two LayerNorms 256
    block = 12288 + 4096 + 32768 + 256
    assert block == 49408
    counts = param_counts(cfg)
    assert counts["blocks"] == 2 * 49408
    assert counts["embedding"] == 256 * 64 + 256 * 64  # tokens + positions
    assert counts["head"] == 64 * 256 + 128  # lm head + final LayerNorm
    assert counts["total"] == 98816 + 32768 + 16512


def test_counts_match_the_real_module() -> None:
    from toolkit.train.models import build_model

    for cfg in (
        GPTConfig(num_layers=3, dim=96, num_heads=4, vocab_size=300, max_seq_len=64),
        TimeSeriesConfig(num_layers=2, dim=32, num_heads=2, num_series=7, max_seq_len=16),
    ):
        model = build_model(cfg)
        assert param_counts(cfg)["total"] == sum(p.numel() for p in model.parameters())


def test_gpt_125m_flops_per_token_by_hand() -> None:
    cfg = GPTConfig(
        kind="gpt", num_layers=12, dim=768, num_heads=12, vocab_size=50304, max_seq_len=2048
    )
    # matmul params N = 12 blocks * (4*768^2 + 8*768^2 + 4*768) + 768*50304 + 2*768
    n = 12 * (12 * 768**2 + 4 * 768) + 768 * 50304 + 2 * 768
    assert n == 123_606_528
    # 6N + 12 * L * d * S at S = 1024
    assert flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 768 * 1024 == 854_885_376


def test_mfu_is_achieved_over_peak() -> None:
    # 10k tok/s * 1e9 FLOP/tok = 1e13 FLOP/s over 4 devices of 1e13 peak -> 25 %
    assert mfu(10_000, 1e9, 1e13, 4) == pytest.approx(0.25)
    assert mfu(1.0, 1.0, 0.0, 1) == 0.0
