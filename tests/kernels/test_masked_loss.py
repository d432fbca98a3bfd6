"""The fused masked regression loss against its PyTorch reference, the reference against
today's masked_mse and the written formula (toolkit.kernels.masked_loss; docs/kernels.md).

Tolerances: the loss is a sum of per-block partial sums (kernel) vs one torch reduction
(reference) in fp32: 1e-6 relative on a mean of order 1. The gradient is elementwise, the
same products in another order (upstream grad x 1/numel x weight x l'(e) vs autograd's chain):
a few fp32 ulps (rtol 1e-6) in fp32, and in bf16 (pred read into fp32, the gradient rounded
once to bf16) within one bf16 ulp."""

from __future__ import annotations

import pytest
import torch

from toolkit.config.model import TimeSeriesConfig, problems
from toolkit.kernels import masked_loss
from toolkit.kernels.backend import triton_runs_on
from toolkit.kernels.masked_loss import masked_regression_loss, masked_regression_loss_reference
from toolkit.train.models.timeseries import TimeSeriesTransformer, masked_mse

pytestmark = pytest.mark.skipif(
    not triton_runs_on("cpu"), reason="needs triton and TRITON_INTERPRET=1 (tests/conftest.py)"
)
GRAD_TOL = {
    torch.float32: {"rtol": 1e-6, "atol": 1e-9},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-6},
}


def inputs(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0):
    """pred, target with ~25 % NaN (and one all-missing row), weights in [0.5, 1.5)."""
    gen = torch.Generator().manual_seed(seed)
    pred = (torch.randn(shape, generator=gen) * 2).to(dtype)
    target = torch.randn(shape, generator=gen)
    target[torch.rand(shape, generator=gen) < 0.25] = float("nan")
    target.view(-1, shape[-1])[0] = float("nan")
    return pred, target, torch.rand(shape[-1], generator=gen) + 0.5


def run(fn, pred, *args, **kwargs):
    pred = pred.clone().requires_grad_(True)
    loss = fn(pred, *args, **kwargs)
    loss.backward()
    return loss, pred.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("kind", ["mse", "huber"])
@pytest.mark.parametrize("n", [1, 7, 33])
def test_kernel_matches_reference(n: int, kind: str, weighted: bool, dtype: torch.dtype) -> None:
    pred, target, weight = inputs((3, 5, n), dtype)
    weight = weight if weighted else None
    loss, grad = run(masked_regression_loss, pred, target, weight, kind, 0.7)
    ref, ref_grad = run(masked_regression_loss_reference, pred, target, weight, kind, 0.7)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL[dtype])
    assert (grad[~torch.isfinite(target)] == 0).all()


def test_unweighted_mse_reference_is_masked_mse_bitwise() -> None:
    for shape in [(4, 6, 16), (2, 3, 1)]:
        pred, target, _ = inputs(shape)
        assert torch.equal(masked_regression_loss_reference(pred, target), masked_mse(pred, target))


def test_the_formula_counts_missing_targets_in_the_denominator() -> None:
    pred = torch.tensor([[1.0, 3.0], [0.0, -2.0]])
    target = torch.tensor([[0.0, float("nan")], [0.5, 0.0]])
    weight = torch.tensor([2.0, 0.5])
    # observed errors 1 (w 2), -0.5 (w 2), -2 (w 0.5); four targets in the mean
    mse = (2 * 1 + 2 * 0.25 + 0.5 * 4) / 4
    huber = (2 * 0.5 + 2 * 0.125 + 0.5 * 1 * (2 - 0.5)) / 4  # delta 1
    for fn in (masked_regression_loss, masked_regression_loss_reference):
        assert fn(pred, target, weight).item() == pytest.approx(mse)
        assert fn(pred, target, weight, kind="huber").item() == pytest.approx(huber)


def test_a_split_batch_adds_up_to_the_whole() -> None:
    """Rank/micro-batch shares (each over its own numel) average to the whole batch's loss."""
    pred, target, weight = inputs((8, 7))
    whole = masked_regression_loss(pred, target, weight)
    halves = [masked_regression_loss(pred[i::2], target[i::2], weight) for i in (0, 1)]
    assert (sum(halves) / 2).item() == pytest.approx(whole.item(), rel=1e-6)


def test_a_mask_is_the_same_as_nan_targets() -> None:
    pred, target, _ = inputs((3, 7))
    mask = torch.isfinite(target)
    filled = target.nan_to_num(5.0)
    for fn in (masked_regression_loss, masked_regression_loss_reference):
        assert fn(pred, filled, mask=mask).item() == pytest.approx(fn(pred, target).item())


def test_reference_chunks_give_the_same_result(monkeypatch) -> None:
    pred, target, weight = inputs((9, 7))
    whole = masked_regression_loss_reference(pred, target, weight, "huber")
    monkeypatch.setattr(masked_loss, "REFERENCE_CHUNK", 14)
    chunked = masked_regression_loss_reference(pred, target, weight, "huber")
    assert chunked.item() == pytest.approx(whole.item(), rel=1e-6)


def test_bad_inputs_are_refused_with_what_to_pass() -> None:
    pred, target, _ = inputs((2, 3))
    with pytest.raises(ValueError, match="unknown loss; allowed: mse, huber"):
        masked_regression_loss(pred, target, kind="l1")
    with pytest.raises(ValueError, match=r"expected \[instruments\] = \[3\]"):
        masked_regression_loss(pred, target, torch.ones(4))
    with pytest.raises(ValueError, match="the Huber threshold must be > 0"):
        masked_regression_loss(pred, target, kind="huber", delta=0.0)


def test_opcheck_on_the_custom_ops() -> None:
    pred, target, weight = inputs((2, 3, 5))
    args = (pred.requires_grad_(True), target, weight, "huber", 0.5)
    torch.library.opcheck(masked_loss._fwd_op, args)
    back = (torch.tensor(1.5), pred.detach(), target, None, "mse", 1.0)
    torch.library.opcheck(masked_loss._bwd_op, back)
    last = (pred.detach()[:, -1].requires_grad_(True), target[:, -1], weight, "mse", 1.0)
    torch.library.opcheck(masked_loss._fwd_op, last)  # the model's pred[:, -1], a strided view


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_torch_compile_fullgraph_with_inductor() -> None:
    pred, target, weight = inputs((2, 3, 5))

    def loss(p, t, w):
        return masked_regression_loss(p * 1.5, t, w, kind="huber")  # something around the op

    compiled = torch.compile(loss, fullgraph=True)
    got, grad = run(compiled, pred, target, weight)
    want, want_grad = run(loss, pred, target, weight)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, want_grad)


def test_the_model_loss_on_either_path() -> None:
    base = dict(kind="timeseries", num_layers=1, dim=16, num_heads=2, max_seq_len=8)
    base |= dict(num_series=12, num_targets=4, loss="huber", huber_delta=0.5)
    weights = [1.0, 2.0, 0.5, 0.5]
    ref = TimeSeriesTransformer(TimeSeriesConfig(**base, loss_weights=weights))
    fused = TimeSeriesTransformer(TimeSeriesConfig(**base, loss_weights=weights, kernels="liger"))
    fused.kernels = "liger"  # as use_kernels sets it once resolved; the norms stay torch here
    fused.load_state_dict(ref.state_dict())
    x, targets = torch.randn(2, 6, 12), torch.randn(2, 4)
    targets[0, 1] = float("nan")
    torch.testing.assert_close(fused(x, targets), ref(x, targets), rtol=1e-6, atol=1e-7)
    plain = TimeSeriesTransformer(TimeSeriesConfig(**{**base, "loss": "mse"}))
    pred = plain(x)
    assert torch.equal(plain.loss(pred, targets), masked_mse(pred, targets))


def test_config_problems_name_the_field() -> None:
    ts = dict(kind="timeseries", num_series=12, num_targets=4)
    assert problems(TimeSeriesConfig(**ts, loss="huber", loss_weights=[1, 1, 1, 1])) == []
    assert problems(TimeSeriesConfig(**ts, loss="l1")) == [
        "model.loss=l1: unknown; allowed: mse, huber"
    ]
    (msg,) = problems(TimeSeriesConfig(**ts, loss="huber", huber_delta=0))
    assert msg.startswith("model.huber_delta=0: must be > 0")
    (msg,) = problems(TimeSeriesConfig(**ts, loss_weights=[1.0, 2.0]))
    assert msg.startswith("model.loss_weights has 2 values: needs one per target (4)")
    (msg,) = problems(TimeSeriesConfig(**ts, loss_weights=[1.0, -1.0, 1.0, 1.0]))
    assert msg == "model.loss_weights: every weight must be >= 0"
