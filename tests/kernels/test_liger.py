"""Liger's kernels against their PyTorch references, forward and backward, under Triton's
interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET=1 where there is no GPU).

Tolerances, and why:
* float32: the kernels reorder sums (the fused cross-entropy's matmul runs per chunk of
  rows and its softmax online over blocks of the vocabulary; LayerNorm's weight and bias
  gradients are summed per group of rows, then over groups): 1e-5 of the largest value.
* bfloat16: both paths keep bf16 inputs and outputs and compute statistics and the loss in
  float32; what differs is where rounding to bf16 happens (the weight gradient is summed over
  chunks in float32 and rounded once; torch's bf16 matmul rounds once too, but sums in
  another order). One bf16 rounding is 2^-8 (0.4 %) relative; we allow 2 % of the largest
  value (a few roundings), and the loss, a float32 mean, 1e-3 relative.
"""

from __future__ import annotations

import pytest
import torch

from toolkit.kernels import liger

pytestmark = pytest.mark.skipif(
    not liger.importable("liger_kernel"), reason="liger-kernel is not installed"
)

# Odd sizes: vocab 257 (not a power of two: the kernel's block is masked), dim 72, 39 rows
# (Liger's chunk is 16 rows here: two full chunks and a partial one).
TOKENS, DIM, VOCAB = (3, 13), 72, 257
REL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
LOSS_REL = {torch.float32: 1e-6, torch.bfloat16: 1e-3}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str) -> None:
    """|actual - expected| <= rel * max|expected|, elementwise (computed in float64)."""
    a, e = actual.double(), expected.double()
    err = (a - e).abs().max().item()
    scale = e.abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel} x {scale:.3g}"


def leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]


def flce_inputs(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*TOKENS, DIM, generator=g).to(dtype)
    weight = (0.3 * torch.randn(VOCAB, DIM, generator=g)).to(dtype)
    targets = torch.randint(0, VOCAB, TOKENS, generator=g)
    targets[0, 0], targets[-1, -1] = 0, VOCAB - 1  # the first and last classes
    return hidden, weight, targets


def run(fn, hidden, weight, targets):
    hidden, weight = leaves(hidden, weight)
    loss = fn(hidden, weight, targets)
    loss.backward()
    return loss, hidden.grad, weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_linear_cross_entropy_matches_linear_then_float32_cross_entropy(dtype):
    inputs = flce_inputs(dtype)
    loss, d_hidden, d_weight = run(liger.fused_linear_cross_entropy, *inputs)
    ref_loss, ref_hidden, ref_weight = run(liger.reference_linear_cross_entropy, *inputs)
    assert loss.dtype == torch.float32 and loss.shape == ()  # the loss in float32, as now
    assert d_hidden.dtype == dtype and d_weight.dtype == dtype  # grads in the params' dtype
    assert loss.item() == pytest.approx(ref_loss.item(), rel=LOSS_REL[dtype])
    assert_close(d_hidden, ref_hidden, REL[dtype], "grad of hidden")
    assert_close(d_weight, ref_weight, REL[dtype], "grad of the head weight")


def test_fused_cross_entropy_ignores_targets_like_pytorch():
    """IGNORE_INDEX (-100, F.cross_entropy's default) adds no loss and is not counted in the
    mean; its rows get no gradient. Here a whole chunk's worth of rows is ignored."""
    hidden, weight, targets = flce_inputs(torch.float32, seed=1)
    targets[1, :] = liger.IGNORE_INDEX
    targets[2, 5] = liger.IGNORE_INDEX
    loss, d_hidden, d_weight = run(liger.fused_linear_cross_entropy, hidden, weight, targets)
    ref_loss, ref_hidden, ref_weight = run(
        liger.reference_linear_cross_entropy, hidden, weight, targets
    )
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert_close(d_hidden, ref_hidden, 1e-5, "grad of hidden")
    assert_close(d_weight, ref_weight, 1e-5, "grad of the head weight")
    assert d_hidden[1].abs().max().item() == 0.0


def test_fused_cross_entropy_scales_its_gradient_by_the_upstream_one():
    """The trainer divides the loss by grad_accum: the gradients follow (Liger multiplies
    its saved gradients by a grad_output that is not 1)."""
    inputs = flce_inputs(torch.float32, seed=2)
    _, d_hidden, d_weight = run(lambda *a: liger.fused_linear_cross_entropy(*a) / 4, *inputs)
    _, ref_hidden, ref_weight = run(
        lambda *a: liger.reference_linear_cross_entropy(*a) / 4, *inputs
    )
    assert_close(d_hidden, ref_hidden, 1e-5, "grad of hidden")
    assert_close(d_weight, ref_weight, 1e-5, "grad of the head weight")


def test_fused_cross_entropy_without_grad_returns_the_loss_only():
    hidden, weight, targets = flce_inputs(torch.float32, seed=3)
    with torch.no_grad():
        loss = liger.fused_linear_cross_entropy(hidden, weight, targets)
        ref = liger.reference_linear_cross_entropy(hidden, weight, targets)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_norm_matches_pytorch_forward_and_backward(dtype):
    g = torch.Generator().manual_seed(0)
    x = (3 + 2 * torch.randn(*TOKENS, DIM, generator=g)).to(dtype)  # a mean and a scale
    weight = (1 + 0.1 * torch.randn(DIM, generator=g)).to(dtype)
    bias = (0.1 * torch.randn(DIM, generator=g)).to(dtype)
    upstream = torch.randn(*TOKENS, DIM, generator=g).to(dtype)
    outs = []
    for fn in (liger.layer_norm, liger.reference_layer_norm):
        leaf = leaves(x, weight, bias)
        y = fn(*leaf, 1e-5)
        y.backward(upstream)
        outs.append((y, *(t.grad for t in leaf)))
    (y, dx, dw, db), (ry, rdx, rdw, rdb) = outs
    assert y.dtype == dtype and dx.dtype == dtype and dw.dtype == dtype
    for got, want, what in ((y, ry, "y"), (dx, rdx, "dx"), (dw, rdw, "dw"), (db, rdb, "db")):
        assert_close(got, want, REL[dtype], what)


def test_fused_ce_bytes_keeps_no_logits():
    """The performance model's fact: at gpt_125m's head, the fused path keeps the hidden and
    weight gradients (bf16), far less than the logits and their float32 copy."""
    tokens, dim, vocab = 2048, 768, 50304
    fused = liger.fused_ce_bytes(tokens, dim, vocab, compute_bytes=2)
    logits = tokens * vocab * (2 + 4)
    assert fused["kept"] == (tokens + vocab) * dim * 2
    assert fused["kept"] < logits / 3
    # Liger's chunk: next power of two of 2048 / ceil(50304 / 768) = 32 rows of logits.
    assert fused["transient"] == 32 * vocab * 2 + vocab * dim * 4


@pytest.mark.parametrize("case", liger.BENCH_CASES, ids=lambda c: c.name)
def test_bench_cases_agree_at_test_size(case):
    """The cases the kernel benchmark collects: their kernel and reference agree (fp32)."""
    torch.manual_seed(0)
    inputs = case.make_inputs("test", torch.float32, torch.device("cpu"))
    got = case.kernel(*inputs)
    want = case.reference(*leaves(*inputs))
    assert_close(got.detach(), want.detach(), 1e-5, case.name)
    got.float().sum().backward()  # the benchmark's backward runs
    assert all(t.grad is not None for t in inputs if t.requires_grad)


def test_the_memory_benchmark_sees_the_logits_go():
    """toolkit.bench.kernels' measurement (saved for backward, largest tensor), on a head whose logits outweigh its weight
    (64 tokens x dim 16 x vocab 1024, float32): the reference keeps the float32 log-softmax
    [tokens, vocab] for backward; the fused kernel keeps the gradients of hidden and weight,
    and the largest tensor it ever makes is the weight gradient's float32 accumulator."""
    from toolkit.bench import kernel_measure as km

    def measure(fn, inputs):
        return {
            "saved_bytes": km.saved_bytes(fn, inputs),
            "largest_bytes": km.largest_bytes(fn, inputs),
        }

    def fresh(inputs):
        return tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)

    tokens, dim, vocab = 64, 16, 1024
    g = torch.Generator().manual_seed(0)
    inputs = (
        torch.randn(tokens, dim, generator=g).requires_grad_(),
        torch.randn(vocab, dim, generator=g).requires_grad_(),
        torch.randint(0, vocab, (tokens,), generator=g),
    )
    reference = measure(liger.reference_linear_cross_entropy, fresh(inputs))
    fused = measure(liger.fused_linear_cross_entropy, fresh(inputs))
    log_probs = tokens * vocab * 4
    assert log_probs <= reference["saved_bytes"] <= log_probs + 16  # and nll's total weight
    assert reference["largest_bytes"] == log_probs
    assert fused == {"saved_bytes": (tokens + vocab) * dim * 4, "largest_bytes": vocab * dim * 4}
    assert liger.fused_ce_bytes(tokens, dim, vocab, 4)["kept"] == fused["saved_bytes"]


def test_all_targets_ignored_is_zero_for_liger_where_pytorch_gives_nan():
    """The one documented difference (docs/kernels.md): 0 / 0 non-ignored targets."""
    hidden, weight, targets = flce_inputs(torch.float32, seed=4)
    targets = torch.full_like(targets, liger.IGNORE_INDEX)
    loss, d_hidden, d_weight = run(liger.fused_linear_cross_entropy, hidden, weight, targets)
    assert loss.item() == 0.0 and d_hidden.abs().max() == 0 and d_weight.abs().max() == 0
    assert liger.reference_linear_cross_entropy(hidden, weight, targets).isnan()
