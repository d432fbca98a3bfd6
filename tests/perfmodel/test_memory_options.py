"""Memory options in the performance model, checked against hand computations: the fused
linear cross-entropy (model.kernels=liger) and low-bit optimizer states (optim.name)."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.config.model import GPTConfig
from toolkit.perfmodel import Layout
from toolkit.perfmodel.memory import memory
from toolkit.perfmodel.memory_options import (
    OPTIMIZER_STATE_BYTES,
    chunk_tokens,
    fused_cross_entropy,
    fused_loss_bytes,
    optimizer_state_bytes_per_param,
)

GPT_TINY = GPTConfig(
    name="gpt_tiny", num_layers=2, dim=64, num_heads=4, vocab_size=256, max_seq_len=256
)
TINY_PARAMS = 148096
# The same layout as tests/perfmodel/test_formulas.py: 2 ranks, fp32, 8 x 128 tokens.
TINY = Layout(world_size=2, ranks_per_node=2, micro_batch_size=8, grad_accum=1, seq_len=128)


def test_optimizer_state_bytes_table():
    # AdamW: two fp32 states. AdamW8bit: two int8 states + an fp32 scale per 256-block each.
    assert optimizer_state_bytes_per_param("adamw") == 8.0
    assert optimizer_state_bytes_per_param("adamw8bit") == 2 + 2 * 4 / 256 == 2.03125
    # every optimizer name the config accepts has a number and a source
    from toolkit.config.optim import OptimConfig

    assert set(OPTIMIZER_STATE_BYTES) == set(OptimConfig.NAMES)
    assert all(source for _, source in OPTIMIZER_STATE_BYTES.values())
    with pytest.raises(ValueError, match="no state size"):
        optimizer_state_bytes_per_param("sgd")


def test_liger_chunk_is_liger_formula():
    # Liger: inc_factor = ceil(V / H); chunk = next_pow2(ceil(BT / inc_factor)), <= BT.
    # 4096 tokens, V 32000, H 512: inc 63, ceil(4096/63) = 66 -> 128
    assert chunk_tokens(4096, 32000, 512) == 128
    # V <= H: one chunk of all the tokens
    assert chunk_tokens(1000, 256, 512) == 1000
    # tiny: inc ceil(256/64) = 4, 1024/4 = 256
    assert chunk_tokens(1024, 256, 64) == 256


def test_fused_loss_keeps_a_chunk_and_the_two_gradients():
    b = fused_loss_bytes(4096, 32000, 512, 2)
    assert b["chunk"] == 128 * 32000 * 2 == 8_192_000
    assert b["held"] == (4096 * 512 + 32000 * 512) * 2 == 36_962_304
    # against the unfused loss's 12 B per logit: 4096 * 32000 * 12 = 1.57 GB
    assert b["chunk"] + b["held"] < 4096 * 32000 * 12 / 30


def test_only_liger_on_the_gpt_runs_fused():
    assert fused_cross_entropy("liger", token_inputs=True)
    assert not fused_cross_entropy("torch", token_inputs=True)
    assert not fused_cross_entropy("auto", token_inputs=True)  # may fall back to torch: not counted
    assert not fused_cross_entropy("liger", token_inputs=False)


def test_memory_gpt_tiny_with_fused_loss():
    m = memory(GPT_TINY, dataclasses.replace(TINY, kernels="liger"))
    # chunk 256 tokens x 256 logits x 4 B = 262144; held (1024*64 + 256*64) * 4 = 327680
    assert m["logits_bytes"] == 262144
    assert m["loss_held_bytes"] == 327680
    # backward: params 296192 + AdamW 592384 + gathered 592384 + activations 9437184
    # + held 327680 + max(chunk 262144, block staging 395264) = 11641088
    # (unfused: ... + 3145728 = 14063872, test_formulas)
    assert m["backward_peak_bytes"] == 11641088
    assert m["peak_bytes"] == 11641088
    assert memory(GPT_TINY, TINY)["peak_bytes"] - m["peak_bytes"] == 3145728 - 327680 - 395264


def test_memory_gpt_tiny_with_8bit_states():
    m = memory(GPT_TINY, dataclasses.replace(TINY, optimizer="adamw8bit"))
    # 148096 params * 2.03125 B / 2 ranks = 150410
    assert m["optimizer_bytes"] == TINY_PARAMS * 2.03125 / 2 == 150410
    assert m["optimizer_state_bytes_per_param"] == 2.03125
    # backward peak falls by AdamW's 592384 - 150410
    assert memory(GPT_TINY, TINY)["backward_peak_bytes"] - m["backward_peak_bytes"] == (
        592384 - 150410
    )
    both = memory(GPT_TINY, dataclasses.replace(TINY, kernels="liger", optimizer="adamw8bit"))
    # 296192 + 150410 + 592384 + 9437184 + 327680 + 395264
    assert both["peak_bytes"] == 11199114


def test_layout_from_job_carries_kernels_and_optimizer():
    from toolkit.config.job import JobConfig
    from toolkit.perfmodel.job import layout_from_job

    job = JobConfig()
    job.model.kernels = "liger"
    job.optim.name = "adamw8bit"
    lay = layout_from_job(job, 1)
    assert (lay.kernels, lay.optimizer) == ("liger", "adamw8bit")


def test_the_state_table_follows_the_formats_the_optimizer_runs():
    from toolkit.config.optim import OptimConfig
    from toolkit.perfmodel.memory_options import optimizer_state_bytes_per_param
    from toolkit.train.optim import state_bytes_per_param

    for name in OptimConfig.NAMES:  # every optim.name has one size, the same in both places
        assert optimizer_state_bytes_per_param(name) == state_bytes_per_param(name)
