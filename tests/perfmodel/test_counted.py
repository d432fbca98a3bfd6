"""Counted costs (toolkit.perfmodel.counted): FLOPs, parameters and saved activations of any
nn.Module, measured by one forward + backward on meta tensors, agree with the analytic GPT
formulas and with hand-computed FLOPs for a user's LSTM and TCN (tests/fixtures/userpkg)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolkit.config.model import GPTConfig
from toolkit.perfmodel.counted import count
from toolkit.perfmodel.layout import Layout
from toolkit.perfmodel.memory import memory
from toolkit.train.flops import flops_per_token
from toolkit.train.models.gpt import GPT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # the user's package root
# conf/model/gpt_small.yaml and gpt_1b.yaml
GPT_SMALL = GPTConfig(name="gpt_small", num_layers=4, dim=192, num_heads=6, max_seq_len=512)
GPT_1B = GPTConfig(
    name="gpt_1b", num_layers=24, dim=2048, num_heads=16, vocab_size=50304, max_seq_len=2048
)


@pytest.fixture
def userpkg(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    import userpkg.counted_models

    return userpkg.counted_models


def count_gpt(cfg: GPTConfig, batch: int, seq: int):
    tokens = lambda: (torch.zeros(batch, seq, dtype=torch.long),) * 2  # noqa: E731
    return count(lambda: GPT(cfg), tokens, tokens_per_sample=seq)


def norm_params(cfg: GPTConfig) -> int:
    return cfg.num_layers * 4 * cfg.dim + 2 * cfg.dim  # two LayerNorms a block, the final one


def test_gpt_counted_flops_agree_with_the_analytic_formula_within_2_percent():
    # Attention: the counter counts the fused (flash) op's forward as the full seq x seq score
    # and value matmuls, also with is_causal=True (4*b*h*S*S*hd), and its backward as twice
    # that (model FLOPs, without flash's recomputation), which is exactly the analytic
    # 12*L*d*S per token. The only difference is in 6N: the analytic N counts the LayerNorms'
    # weights and biases as matmul parameters, the counter counts only the matmuls, so
    # counted = analytic - 6 * norm parameters per token (0.17 % of gpt_small at seq 128).
    seq = 128
    cost = count_gpt(GPT_SMALL, batch=2, seq=seq)
    analytic = flops_per_token(GPT_SMALL, seq)
    assert cost.flops_per_token == analytic - 6 * norm_params(GPT_SMALL)
    assert cost.flops_per_token / analytic == pytest.approx(0.9983, abs=1e-4)
    assert abs(cost.flops_per_token / analytic - 1) < 0.02  # the bound
    assert cost.flops == pytest.approx(3 * cost.forward_flops)  # backward = 2x forward
    assert "aten._scaled_dot_product_flash_attention" in cost.flops_by_op
    assert cost.num_params == sum(p.numel() for p in GPT(GPT_SMALL).parameters())
    assert cost.param_bytes == 4 * cost.num_params


def test_gpt_saved_activations_are_within_7_percent_of_the_memory_models_term():
    # memory.py's activation term is 9 + 2r = 17 units of batch*seq*dim per block (and 2 for
    # the final norm). Counted, a block saves 16: memory.py counts the attention output's
    # "contiguous copy" (the proj input) as a unit of its own, but the flash kernel's output
    # is laid out [batch, seq, heads, head_dim], so transpose + reshape is a view of the
    # tensor attention already saved. The LayerNorm statistics and attention's log-sum-exp
    # add about 0.6 %. So counted/model = (16L + 2)/(17L + 2) + 0.006 = 0.949 for gpt_small:
    # the model overstates activations by ~5 %, on the safe side. The loss's log-probabilities
    # (batch*seq*vocab fp32, memory.py's separate logits term) are added to the model's side.
    batch, seq = 2, 128
    cost = count_gpt(GPT_SMALL, batch, seq)
    layout = Layout(
        world_size=1, ranks_per_node=1, micro_batch_size=batch, grad_accum=1, seq_len=seq
    )
    modelled = memory(GPT_SMALL, layout)["activations_bytes"]
    log_probs = batch * seq * GPT_SMALL.vocab_size * 4
    ratio = cost.saved_bytes / (modelled + log_probs)
    L = GPT_SMALL.num_layers
    assert ratio == pytest.approx((16 * L + 2) / (17 * L + 2) + 0.006, abs=0.005)
    assert 0.93 < ratio <= 1.0


def test_without_fused_attention_the_math_path_saves_the_attention_matrix():
    batch, seq = 2, 128
    tokens = lambda: (torch.zeros(batch, seq, dtype=torch.long),) * 2  # noqa: E731
    fused = count(lambda: GPT(GPT_SMALL), tokens)
    math = count(lambda: GPT(GPT_SMALL), tokens, fused_attention=False)
    assert math.flops == fused.flops  # the same model FLOPs either way (bmm instead)
    scores = batch * GPT_SMALL.num_heads * seq * seq * 4  # one fp32 [b, h, S, S] per block
    # The math path keeps the softmax output and its own copies of q, k, v; the flash path
    # the output and log-sum-exp: the difference is the attention matrices, to within 10 %.
    extra = math.saved_bytes - fused.saved_bytes
    assert extra == pytest.approx(GPT_SMALL.num_layers * scores, rel=0.1)


def test_user_lstm_flops_are_the_gate_matmuls(userpkg):
    # Per layer and time step the gates are x W_ih^T + h W_hh^T: 2*4H*(I+H) per sample
    # forward. Backward is twice that, less what autograd need not compute: the gradient of
    # the first layer's input (the data: 2*4H*In per step, In its width) and of each layer's zero initial
    # state (2*4H*H at the first step). Head: one Linear H -> targets.
    B, T, In, H, L, out = 8, 64, 48, 256, 2, 16
    cost = userpkg.lstm_workload(batch=B, time=T).count()
    widths = [In] + [H] * (L - 1)
    forward = sum(2 * 4 * H * (i + H) * T for i in widths) + 2 * H * out
    backward = 2 * forward - 2 * 4 * H * In * T - L * 2 * 4 * H * H
    assert cost.forward_flops_per_sample == forward
    assert cost.flops_per_sample == forward + backward
    assert cost.flops_per_token == (forward + backward) / T
    assert cost.num_params == 4 * H * (In + H + 2) + 4 * H * (H + H + 2) + H * out + out


def test_user_tcn_flops_are_the_convolutions(userpkg):
    # A Conv1d is 2*C_out*C_in*K per output position forward (bias not counted); backward the
    # weight gradient is the same again and the input gradient too, except for the first
    # conv, whose input is the data.
    B, T, F, C, K, L = 8, 256, 16, 64, 3, 4
    cost = userpkg.tcn_workload(batch=B, time=T).count()
    convs = [(F, C, K)] + [(C, C, K)] * (L - 1) + [(C, 1, 1)]  # (c_in, c_out, k), the head last
    per = [2 * c_in * c_out * k * T for c_in, c_out, k in convs]
    assert cost.forward_flops_per_sample == sum(per)
    assert cost.flops_per_sample == sum(per) + 2 * sum(per) - per[0]


def test_counting_a_1b_model_allocates_no_real_memory():
    # gpt_1b's parameters alone would take 5.3 GB in fp32. Linux's peak RSS (VmHWM) is reset
    # before counting, so its rise is what counting took at its peak.
    clear_refs = Path("/proc/self/clear_refs")
    if not clear_refs.exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    clear_refs.write_text("5")
    before = _status_kb("VmHWM")
    cost = count_gpt(GPT_1B, batch=1, seq=128)
    grown = (_status_kb("VmHWM") - before) * 1024
    assert cost.param_bytes > 5e9
    assert grown < 0.02 * cost.param_bytes  # ~100 MB at most: Python objects, not tensors


def test_a_model_built_with_an_explicit_device_is_refused_in_one_line():
    from toolkit.errors import UserError

    class Pinned(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(4, 4, device="cpu"))

        def forward(self, x):
            return x @ self.w

    with pytest.raises(UserError, match=r"count: w is on cpu, not meta"):
        count(Pinned, torch.zeros(2, 4))


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)
