"""The GPT with model.kernels=liger: same loss and gradients as with torch, same state-dict
keys, no logits built when targets are given; and which kernels run where (resolve)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.kernels.test_liger import assert_close
from toolkit.checkpoint.state import changes_meaning
from toolkit.config.model import ModelConfig
from toolkit.errors import UserError
from toolkit.kernels import liger
from toolkit.kernels.checks import liger_problem
from toolkit.train.models import build_model, use_kernels
from toolkit.train.models.blocks import LayerNorm

pytestmark = pytest.mark.skipif(
    not liger.importable("liger_kernel"), reason="liger-kernel is not installed"
)

# gpt_tiny's shape with an odd vocabulary and width (masked blocks, partial chunks).
CFG = ModelConfig(num_layers=2, dim=72, num_heads=4, vocab_size=257, max_seq_len=32)
BATCH, SEQ = 2, 13


def pair(**block_settings) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = build_model(CFG)
    model.reset_parameters()
    for block in model.blocks.values():
        for name, value in block_settings.items():
            setattr(block, name, value)
    fused = copy.deepcopy(model)
    use_kernels(fused, "liger")
    return model, fused


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, CFG.vocab_size, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_and_grads(model: torch.nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    inputs, targets = batch()
    loss = model(inputs, targets)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "activation_checkpointing"])
def test_liger_gpt_gives_torch_loss_and_gradients(recompute):
    """Every parameter's gradient (embeddings, norms, attention, MLP, head) agrees; with
    activation checkpointing the blocks' Liger LayerNorms run again in backward."""
    model, fused = pair(activation_checkpointing=recompute)
    loss, grads = loss_and_grads(model)
    fused_loss, fused_grads = loss_and_grads(fused)
    assert fused_loss == pytest.approx(loss, rel=1e-6)
    assert fused_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert_close(fused_grads[name], grad, 1e-4, name)  # summed over 2 layers and chunks


def test_liger_gpt_builds_no_logits_with_targets():
    """With targets the head module never runs, and nothing of the logits' size is kept for
    backward; without targets the logits come back as before."""
    model, fused = pair()
    inputs, targets = batch()
    saved = {}
    for name, m in (("torch", model), ("liger", fused)):
        shapes = []
        calls = []
        hook = m.head.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t, shapes=shapes: shapes.append(tuple(t.shape)) or t, lambda t: t
        ):
            m(inputs, targets)
        hook.remove()
        saved[name] = (shapes, len(calls))
    logits = (BATCH, SEQ, CFG.vocab_size)
    flat_logits = (BATCH * SEQ, CFG.vocab_size)
    assert saved["torch"][1] == 1 and any(s in (logits, flat_logits) for s in saved["torch"][0])
    assert saved["liger"][1] == 0
    assert not any(s in (logits, flat_logits) for s in saved["liger"][0])
    with torch.no_grad():
        assert_close(fused(inputs), model(inputs), 1e-5, "logits without targets")


def test_checkpoints_move_between_kernels():
    model, fused = pair()
    assert list(model.state_dict()) == list(fused.state_dict())
    torch.manual_seed(5)
    other = build_model(CFG)
    other.reset_parameters()
    fused.load_state_dict(other.state_dict())  # strict: same keys and shapes
    assert changes_meaning("model.kernels: 'torch' -> 'liger'") is False  # resume allowed


def test_pipeline_stages_keep_the_kernels_and_compiled_blocks_keep_torch_norms():
    _, fused = pair()
    last = fused.part([1], first=False, last=True)
    assert last.kernels == "liger" and last.norm.kernels == "liger"
    notes = use_kernels(fused, "liger", compiled_blocks=True)
    norms = {n: m.kernels for n, m in fused.named_modules() if isinstance(m, LayerNorm)}
    assert norms == {
        "blocks.0.norm1": "torch",
        "blocks.0.norm2": "torch",
        "blocks.1.norm1": "torch",
        "blocks.1.norm2": "torch",
        "norm": "liger",
    }
    assert fused.kernels == "liger" and "parallel.compile" in notes[0]


def test_auto_picks_liger_only_on_cuda_and_never_under_tensor_parallelism():
    reasons: list[str] = []
    assert liger.resolve("auto", "cpu", reasons) == "torch"  # even under TRITON_INTERPRET=1
    assert liger.resolve("auto", "cuda", reasons) == "liger"  # installed here
    assert liger.resolve("auto", "cuda", reasons, tp=2) == "torch"
    assert liger.resolve("torch", "cuda", reasons) == "torch"
    assert reasons[0] == "auto: torch, the model runs on cpu, not CUDA"
    assert "tensor parallelism" in reasons[2]


def test_liger_where_it_cannot_run_is_one_line_that_says_what_to_do(monkeypatch):
    reasons: list[str] = []
    assert liger.resolve("liger", "cpu", reasons) == "liger"  # TRITON_INTERPRET=1 (conftest)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UserError, match="ranks run on CPU.*TRITON_INTERPRET=1"):
        liger.resolve("liger", "cpu", reasons)
    with pytest.raises(UserError, match="parallel.tp=2.*model.kernels=auto"):
        liger.resolve("liger", "cuda", reasons, tp=2)
    assert "not installed; install the kernels extra" in liger_problem(False, True, 1)
    assert liger_problem(True, True, 1) is None
