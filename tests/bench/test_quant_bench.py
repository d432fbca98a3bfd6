"""`toolkit bench quant` with tiny settings: the figures it reports for each family, as one
model and as an ensemble (their fields and consistency, not their speed), the order-book
data it trains on, and the NVML sampler against a fake NVML (the one fake the project
allows)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from toolkit.bench.quant import main
from toolkit.bench.quant_data import BookSpec, make_windows
from toolkit.bench.quant_step import Utilisation

TINY = [
    "--sizes", "small", "--ensemble", "2", "--batch", "16", "--lookback", "8", "--levels", "2",
    "--train-samples", "400", "--val-samples", "64", "--seconds", "0.05", "--warmup", "1",
    "--eval-every", "2", "--target-loss", "5.0", "--threads", "1",
]  # fmt: skip


def test_each_family_reports_rates_split_and_time_to_target_alone_and_as_an_ensemble(
    tmp_path, capsys
):
    out = tmp_path / "quant.json"
    assert main([*TINY, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert result["device"] == "cpu" and result["data"]["width"] == 2 * 4 + 1
    rows = result["results"]
    assert [(r["family"], r["members"], r["mode"]) for r in rows] == [
        (family, k, "eager") for family in ("lstm", "tcn", "transformer") for k in (1, 2)
    ]
    for r in rows:
        assert r["steps"] >= 1 and r["samples_per_s"] > 0
        assert r["model_samples_per_s"] == pytest.approx(r["members"] * r["samples_per_s"])
        assert set(r["split_ms"]) == {"data", "forward_backward", "optimizer"}
        assert sum(r["split_ms"].values()) <= r["step_ms"] * 1.001  # phases within the step
        assert 0 <= r["data_wait_share"] <= 1
        # a target any model meets at its first validation (the zero predictor scores ~1)
        assert r["time_to_target_s"] is not None and math.isfinite(r["best_val_loss"])
        assert (r["gpu_util_pct"], r["gpu_util_why"]) == (None, "not a GPU")
    ensembles = [s for s in result["speedups"] if "ensemble_vs_separate" in s]
    assert [(s["family"], s["members"]) for s in ensembles] == [
        ("lstm", 2),
        ("tcn", 2),
        ("transformer", 2),
    ]


def test_cuda_graphs_asked_for_on_a_cpu_are_one_line(capsys):
    assert main([*TINY, "--graphs", "on", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "error: --graphs on: CUDA graphs need a CUDA device (this is a CPU)\n"
    )


def test_the_book_is_seeded_and_its_target_is_learnable():
    spec = BookSpec(levels=3, lookback=8, train_samples=3000, val_samples=500, seed=1)
    a, b = make_windows(spec, torch.device("cpu")), make_windows(spec, torch.device("cpu"))
    assert torch.equal(a.features, b.features)
    x, y = a.batch(a.train_ends[:5])
    assert x.shape == (5, 8, spec.width) and y.shape == (5,)
    # the last row predicts the target better than zero does (least squares on train)
    last = a.batch(a.train_ends)[0][:, -1]
    fit = torch.linalg.lstsq(last, a.targets[a.train_ends][:, None]).solution
    vx, vy = a.val()
    assert float(((vx[:, -1] @ fit).squeeze() - vy).square().mean()) < 0.9 * float(
        vy.square().mean()
    )
    assert int(a.val_ends[0]) > int(a.train_ends[-1]) + spec.horizon  # no overlap


def test_gpu_utilisation_is_nvmls_mean_while_the_steps_run():
    calls = []

    class FakeNvml:
        def nvmlInit(self):
            calls.append("init")

        def nvmlDeviceGetHandleByIndex(self, index):
            return f"gpu{index}"

        def nvmlDeviceGetUtilizationRates(self, handle):
            return SimpleNamespace(gpu=60 + 20 * (len(calls) % 2), memory=0)

        def nvmlShutdown(self):
            calls.append("shutdown")

    with Utilisation(torch.device("cuda", 0), FakeNvml(), interval_s=0.005) as util:
        while len(util.samples) < 4:
            calls.append("step")
            torch.zeros(1).add_(1)
    assert util.why is None and 60 <= util.mean() <= 80
    assert (calls[0], calls[-1]) == ("init", "shutdown")
    absent = Utilisation(torch.device("cuda", 0), SimpleNamespace())  # no nvmlInit
    assert absent.mean() is None and absent.why.startswith("NVML unavailable: AttributeError")
