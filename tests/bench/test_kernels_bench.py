"""`python -m toolkit.bench.kernels` on a case built here: a fused GELU x b that saves only its
inputs (recomputing GELU in backward) against the plain PyTorch reference that also saves
GELU's output. The real cases (Liger, our Triton kernels) come from CASE_MODULES."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from toolkit.bench import kernel_measure as km
from toolkit.bench import kernels as bench
from toolkit.kernels.cases import KernelCase

N = 64 * 1024  # elements of each input: 256 KiB in fp32


class FusedGeluMul(torch.autograd.Function):
    """gelu(a) * b saving only a and b: backward recomputes gelu(a)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return F.gelu(a) * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        with torch.enable_grad():
            x = a.detach().requires_grad_()
            y = F.gelu(x)
            (grad_a,) = torch.autograd.grad(y, x, grad * b)
        return grad_a, grad * y.detach()


def reference(a, b):
    return F.gelu(a) * b


def make_inputs(size, dtype, device):
    n = N if size == "test" else 16 * N
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=g).to(device, dtype).requires_grad_()
    b = torch.randn(n, generator=g).to(device, dtype).requires_grad_()
    return a, b


def broken(a, b):
    raise RuntimeError("no kernel here\nsecond line")


BENCH_CASES = (
    KernelCase("gelu_mul", make_inputs, reference, FusedGeluMul.apply, shape=f"{N} elements"),
    KernelCase("gelu_mul_broken", make_inputs, reference, broken),
)


def test_saved_bytes_count_what_autograd_keeps_beyond_the_inputs():
    a, b = make_inputs("test", torch.float32, torch.device("cpu"))
    # reference: GELU saves a (an input), mul saves gelu(a) (new: N * 4 B) and b (an input)
    assert km.saved_bytes(reference, (a, b)) == N * 4
    assert km.saved_bytes(FusedGeluMul.apply, (a, b)) == 0


def test_cpu_peak_counts_the_allocations_of_forward_and_backward():
    a, b = make_inputs("test", torch.float32, torch.device("cpu"))
    ref = km.peak_bytes(reference, (a, b), True, torch.device("cpu"))
    fused = km.peak_bytes(FusedGeluMul.apply, (a, b), True, torch.device("cpu"))
    # the output and a's and b's gradients (3 x N x 4 B) are alive at the end of backward,
    # plus gelu(a) (kept by the reference, recomputed by the fused one) while mul's backward
    # allocates: 4 x N x 4 B at the peak either way, plus the scalar loss and its gradient
    assert ref == fused == 4 * N * 4 + 8
    # without backward nothing but the forward's tensors
    assert km.peak_bytes(reference, (a, b), False, torch.device("cpu")) <= 2 * N * 4 + 4096


def test_the_benchmark_measures_each_variant_against_the_eager_baseline(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr("toolkit.kernels.cases.CASE_MODULES", ("toolkit.kernels.absent", __name__))
    code = bench.main(
        [
            "--size",
            "test",
            "--time",
            "--reps",
            "3",
            "--compile-backend",
            "aot_eager",  # no C++ toolchain needed; inductor is the default
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1  # the broken case's kernel failed
    assert "toolkit.kernels.absent: skipped (No module named 'toolkit.kernels.absent')" in out
    assert "| gelu_mul | 65536 elements | kernel |" in out
    result = json.loads((tmp_path / "kernels.json").read_text())
    assert result["baseline"] == "eager" and result["size"] == "test"
    assert result["machine"]["load_average"]
    rows = {(r["case"], r["variant"]): r for r in result["rows"]}
    eager, compiled, kernel = (rows[("gelu_mul", v)] for v in ("eager", "compiled", "kernel"))
    assert eager["saved_bytes"] == N * 4
    # AOTAutograd's partitioner may recompute the pointwise GELU instead of saving it
    assert compiled["saved_bytes"] in (0, N * 4)
    assert kernel["saved_bytes"] == 0
    assert eager["peak_bytes_vs_eager"] == 1.0
    assert kernel["peak_bytes_vs_eager"] == 1.0  # recomputing costs the same at the peak
    assert kernel["max_abs_diff"] < 1e-6 and compiled["max_abs_diff"] < 1e-6
    for row in (eager, compiled, kernel):
        assert 0 < row["time_s_min"] <= row["time_s_median"] <= row["time_s_max"]
    assert rows[("gelu_mul_broken", "kernel")]["error"] == "RuntimeError: no kernel here"
    assert "peak_bytes" in rows[("gelu_mul_broken", "eager")]


def test_cpu_runs_are_not_timed_unless_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("toolkit.kernels.cases.CASE_MODULES", (__name__,))
    argv = ["--size", "test", "--cases", "gelu_mul", "--compile-backend", "aot_eager"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    assert "not timed" in capsys.readouterr().out
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["eager", "compiled", "kernel"]
    assert all("time_s_median" not in r for r in rows)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--size", "huge"], "--size=huge: allowed: test, bench"),
        (["--dtype", "int8"], "--dtype=int8: allowed"),
        (["--cases", "nothing_like_it"], "--cases: nothing_like_it not found"),
    ],
)
def test_bad_arguments_are_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("toolkit.kernels.cases.CASE_MODULES", (__name__,))
    assert bench.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_case_whose_inputs_cannot_be_made_fails_in_its_rows_only(capsys):
    def no_inputs(size, dtype, device):
        raise MemoryError()

    case = KernelCase("no_inputs", no_inputs, reference, FusedGeluMul.apply)
    args = bench.parse_args(["--compile-backend", "aot_eager"])
    rows = bench.measure_case(case, args, torch.device("cpu"), torch.float32)
    assert [r["variant"] for r in rows] == ["eager", "compiled", "kernel"]
    assert all(r["error"] == "make_inputs: MemoryError" for r in rows)
    assert "| no_inputs |  | eager | make_inputs: MemoryError |" in bench.table(rows)


def test_bytes_are_printed_in_a_unit_that_shows_them():
    assert bench.human_bytes(512) == "512 B"
    assert bench.human_bytes(1536) == "1.50 KiB"
    assert bench.human_bytes(48 * 2**20) == "48.00 MiB"
    assert bench.human_bytes(3 * 2**30) == "3.00 GiB"


def test_on_the_meta_device_the_fused_time_series_ops_keep_only_their_statistics(tmp_path):
    """`--device meta`: the bytes saved for backward at the bench size, exact and in no time;
    the references keep their intermediates, the fused ops (their meta entries) almost
    nothing."""
    modules = "toolkit.kernels.masked_norm,toolkit.kernels.masked_loss"
    assert bench.main(["--device", "meta", "--modules", modules, "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    kept = {(r["case"], r["variant"]): r["saved_bytes"] for r in rows}
    mib = 2**20
    # norm: 32*256*512*8 fp32 deviations (128 MiB) kept by the reference; the op keeps
    # mean and rstd, 32*256*8 fp32 each (0.5 MiB together).
    assert kept["masked_cross_section_norm", "eager"] == 128 * mib + 3 * 32 * 256 * 8 * 4
    assert kept["masked_cross_section_norm", "kernel"] == mib // 2
    # loss: the reference keeps the error (and the Huber branch's masks); the op nothing.
    for loss in ("masked_mse_loss", "masked_huber_loss"):
        assert kept[loss, "eager"] >= 16 * mib and kept[loss, "kernel"] == 0
