"""The fused masked cross-sectional norm against its PyTorch reference, and the reference
against the formula (toolkit.kernels.masked_norm; docs/kernels.md, "Time-series kernels").

Tolerances: fp32 differs from the reference only in summation order (Triton's tree sums over
blocks of instruments vs torch's reductions): 1e-5 relative/absolute on values of order 1.
bf16 inputs are read into fp32 and the result rounded once to bf16 on both paths, so the
outputs differ by at most one bf16 ulp (2^-8 relative): rtol 1.6e-2, atol 1e-2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from toolkit.config.model import TimeSeriesConfig, problems
from toolkit.kernels import masked_norm
from toolkit.kernels.backend import triton_runs_on
from toolkit.kernels.masked_norm import (
    masked_cross_section_norm,
    masked_cross_section_norm_reference,
)
from toolkit.train.models.timeseries import TimeSeriesTransformer

pytestmark = pytest.mark.skipif(
    not triton_runs_on("cpu"), reason="needs triton and TRITON_INTERPRET=1 (tests/conftest.py)"
)
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2}}


def inputs(b: int, t: int, n: int, f: int, dtype: torch.dtype, seed: int = 0):
    """x with NaN at missing positions (they must never be read into a sum), a mask with
    ~25 % missing, a row with nothing observed and a row with one observed instrument."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, t, n, f, generator=gen) * 3 + 1).to(dtype)
    mask = torch.rand(b, t, n, f, generator=gen) >= 0.25
    mask[0, 0] = False  # nothing observed in any feature
    mask[-1, -1] = False
    mask[-1, -1, n // 2] = True  # one instrument observed
    return x.masked_fill(~mask, float("nan")), mask


def run(fn, x, mask, grad):
    x = x.clone().requires_grad_(True)
    y = fn(x, mask)
    (y.float() * grad).sum().backward()
    return y, x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 7, 33])
def test_kernel_matches_reference_forward_and_backward(n: int, dtype: torch.dtype) -> None:
    x, mask = inputs(2, 3, n, 3, dtype)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    y, dx = run(masked_cross_section_norm, x, mask, grad)
    y_ref, dx_ref = run(masked_cross_section_norm_reference, x, mask, grad)
    assert y.dtype == dtype and dx.dtype == dtype
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(dx, dx_ref, **TOL[dtype])
    for out in (y, dx):
        assert torch.isfinite(out.float()).all()
        assert (out[~mask] == 0).all()  # missing positions: 0 out, no gradient


def test_rows_with_no_or_one_observed_value_give_zero_and_no_gradient() -> None:
    x, mask = inputs(2, 3, 7, 3, torch.float32)
    y, dx = run(masked_cross_section_norm, x, mask, torch.ones(x.shape))
    assert (y[0, 0] == 0).all() and (dx[0, 0] == 0).all()
    assert (y[-1, -1] == 0).all() and (dx[-1, -1] == 0).all()


def test_reference_follows_the_formula() -> None:
    """Row by row in float64 numpy: mean and population variance of the observed values."""
    x, mask = inputs(2, 3, 7, 3, torch.float32)
    eps = 1e-5
    y = masked_cross_section_norm_reference(x, mask, eps).numpy()
    xs, ms = x.numpy().astype(np.float64), mask.numpy()
    for b, t, f in np.ndindex(2, 3, 3):
        seen = xs[b, t, ms[b, t, :, f], f]
        want = np.zeros(7)
        if seen.size:
            want[ms[b, t, :, f]] = (seen - seen.mean()) / math.sqrt(seen.var() + eps)
        np.testing.assert_allclose(y[b, t, :, f], want, rtol=1e-5, atol=1e-5)


def test_reference_chunks_give_the_same_result(monkeypatch) -> None:
    x, mask = inputs(3, 5, 7, 3, torch.float32)
    whole = masked_cross_section_norm_reference(x, mask)
    monkeypatch.setattr(masked_norm, "REFERENCE_CHUNK_ROWS", 4)
    assert torch.equal(masked_cross_section_norm_reference(x, mask), whole)


def test_many_instruments_loop_over_blocks() -> None:
    """More instruments than one tile holds (4096 elements): the kernel's loops run."""
    x, mask = inputs(1, 1, 1500, 3, torch.float32)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    y, dx = run(masked_cross_section_norm, x, mask, grad)
    y_ref, dx_ref = run(masked_cross_section_norm_reference, x, mask, grad)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(dx, dx_ref, **TOL[torch.float32])


def test_bad_inputs_are_refused_with_what_to_pass() -> None:
    x = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError, match="mask has shape"):
        masked_cross_section_norm(x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="expected torch.bool"):
        masked_cross_section_norm(x, torch.ones(2, 4, 3))


def test_opcheck_on_the_custom_ops() -> None:
    x, mask = inputs(1, 2, 5, 3, torch.float32)
    x = x.nan_to_num()  # opcheck compares outputs with NaN-sensitive checks on inputs
    torch.library.opcheck(masked_norm._fwd_op, (x.requires_grad_(True), mask, 1e-5))
    _, mean, rstd = masked_norm._fwd_op(x.detach(), mask, 1e-5)
    torch.library.opcheck(masked_norm._bwd_op, (torch.randn(x.shape), x.detach(), mask, mean, rstd))
    strided = x.detach().transpose(0, 1)  # a non-contiguous view: the op copies, fake agrees
    torch.library.opcheck(masked_norm._fwd_op, (strided, mask.transpose(0, 1), 1e-5))


def test_torch_compile_fullgraph_sees_one_op() -> None:
    x, mask = inputs(1, 2, 5, 3, torch.float32)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    torch.compile(masked_cross_section_norm, fullgraph=True, backend=record)(x, mask)
    assert "masked_cs_norm_fwd" in graphs[0]  # the op itself, not its Triton internals
    compiled = torch.compile(masked_cross_section_norm, fullgraph=True, backend="aot_eager")
    grad = torch.randn(x.shape)
    y, dx = run(compiled, x, mask, grad)
    y_ref, dx_ref = run(masked_cross_section_norm_reference, x, mask, grad)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(dx, dx_ref, **TOL[torch.float32])


def ts_config(**overrides) -> TimeSeriesConfig:
    base = dict(kind="timeseries", num_layers=1, dim=16, num_heads=2, max_seq_len=8)
    return TimeSeriesConfig(**{**base, "num_series": 12, "num_targets": 4, **overrides})


def test_the_model_normalises_on_either_path_with_unchanged_state_dict_keys() -> None:
    torch.manual_seed(0)
    plain = TimeSeriesTransformer(ts_config())
    fused = TimeSeriesTransformer(ts_config(cross_section_norm=True, kernels="liger"))
    fused.kernels = "liger"  # as use_kernels sets it once resolved; the norms stay torch here
    ref = TimeSeriesTransformer(ts_config(cross_section_norm=True, kernels="torch"))
    assert list(fused.state_dict()) == list(plain.state_dict())
    ref.load_state_dict(plain.state_dict())
    fused.load_state_dict(plain.state_dict())
    x = torch.randn(2, 6, 12)
    x[:, :, 0:3] = 0.0  # instrument 0 missing (the loader's zeros)
    targets = torch.randn(2, 4)
    losses, grads = [], []
    for model in (ref, fused):
        loss = model(x, targets)
        loss.backward()
        losses.append(loss)
        grads.append(model.inp.weight.grad)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    assert not torch.equal(losses[0], plain(x, targets))  # the norm did something


def test_config_problems_name_the_field() -> None:
    assert problems(ts_config(cross_section_norm=True)) == []
    (msg,) = problems(ts_config(cross_section_norm=True, instruments=5))
    assert msg.startswith("model.num_series=12: not a whole number of features for 5")
    # The GPT has no such option: its own schema refuses it at composition.
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.config.errors import ConfigError

    with pytest.raises(ConfigError, match="model.cross_section_norm: unknown key"):
        to_job(compose_raw(["model=gpt_tiny", "model.cross_section_norm=true"]))


def test_activation_checkpointing_recomputes_the_op() -> None:
    from torch.utils.checkpoint import checkpoint

    x, mask = inputs(2, 3, 7, 3, torch.float32)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))

    def checkpointed(x, mask):
        return checkpoint(
            lambda v: masked_cross_section_norm(v * 2.0, mask), x, use_reentrant=False
        )

    y, dx = run(checkpointed, x, mask, grad)
    y_ref, dx_ref = run(lambda v, m: masked_cross_section_norm_reference(v * 2.0, m), x, mask, grad)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(dx, dx_ref, **TOL[torch.float32])
