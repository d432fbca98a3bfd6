"""`python -m toolkit.measure.run` end to end on the tiny preset (real launcher, 2 CPU ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

REPO = Path(__file__).resolve().parents[2]
SUMMARY_FIELDS = {
    "step_time_s_median",
    "step_time_s_p10",
    "step_time_s_p90",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "mfu",
    "peak_memory_bytes",
    "data_wait_share",
    "forward_backward_s",
    "optimizer_s",
    "data_wait_s",
    "measured_dominant",
    "predicted_step_s",
    "predicted_dominant",
    "step_time_ratio",
    "dominant_match",
    "persistent_bytes",
    "results_h5",
}


def bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO), TOOLKIT_CACHE=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.measure.run", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_benchmark_writes_hdf5_and_json_with_the_documented_fields(tmp_path):
    out = tmp_path / "run"
    proc, summary = bench(
        tmp_path, "--warmup", "2", "--steps", "4", "--out", str(out), "model=gpt_tiny"
    )
    assert summary.keys() >= SUMMARY_FIELDS
    assert summary["measured_steps"] == 4 and summary["warmup_steps"] == 2
    assert summary["world_size"] == 2
    assert summary["step_time_s_p10"] <= summary["step_time_s_median"] <= summary["step_time_s_p90"]
    assert summary["tokens_per_s"] == pytest.approx(2 * summary["tokens_per_s_per_device"])
    assert "model vs measured" in proc.stdout  # predicted and measured side by side
    assert "per term: model vs measured" in proc.stdout  # and per term of the step's split
    for part in ("compute", "exposed_communication", "optimizer", "data_wait"):
        assert summary[f"split_predicted_{part}_s"] >= 0
        assert summary[f"split_measured_{part}_s"] >= 0
    assert summary["split_predicted_compute_s"] > 0 and summary["split_measured_compute_s"] > 0
    # The measured parts are medians of the slowest rank per step: each at most the step.
    assert summary["split_measured_compute_s"] <= summary["split_measured_step_s"]
    assert json.loads((out / "bench.json").read_text()) == summary
    with h5py.File(summary["results_h5"]) as f:
        assert f["steps/step_time_s"].shape == (2, 6)  # ranks x (warm-up + measured)
        assert f["steps"].attrs["warmup_steps"] == 2
        assert f["summary"].attrs["tokens_per_s"] == pytest.approx(summary["tokens_per_s"])
        assert f["prediction/time"].attrs["dominant"] == summary["predicted_dominant"]
        assert "gpt_tiny" in f["run/config_yaml"][()].decode()
        assert "torch" in json.loads(f["run/env_json"][()].decode())


@pytest.mark.slow
def test_two_point_sweep_prints_a_comparison_with_scaling_efficiency_and_plots(tmp_path):
    out = tmp_path / "sweep"
    proc, sweep = bench(
        tmp_path,
        "-m",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--out",
        str(out),
        "model=gpt_tiny",
        "cluster.tasks_per_node=1,2",
    )
    assert "benchmark sweep" in proc.stdout
    assert "scaling eff." in proc.stdout
    assert [r["world_size"] for r in sweep["runs"]] == [1, 2]
    one, two = sweep["runs"]
    assert one["scaling_efficiency"] == pytest.approx(1.0)
    assert two["scaling_efficiency"] == pytest.approx(
        two["tokens_per_s"] / (2 * one["tokens_per_s"])
    )
    for name in ("comparison.png", "scaling.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "0" / "bench" / "results.h5").exists()
    assert (out / "1" / "bench" / "results.h5").exists()


@pytest.mark.slow
def test_time_to_target_stops_at_the_target_loss(tmp_path):
    # gpt_tiny on the built-in corpus: validation loss ~5.5 at init, below 5.0 within ~10 steps.
    proc, summary = bench(
        tmp_path,
        "--warmup",
        "0",
        "--steps",
        "60",
        "--target-loss",
        "5.0",
        "--eval-every",
        "2",
        "--out",
        str(tmp_path / "ttt"),
        "model=gpt_tiny",
    )
    assert summary["stop_reason"] == "target validation loss reached"
    assert summary["reached_target"] is True
    assert summary["steps_to_target"] < 60
    assert summary["steps_to_target"] % 2 == 0
    assert summary["tokens_to_target"] == summary["steps_to_target"] * 2048
    assert summary["time_to_target_s"] > 0
    assert summary["val_loss"] <= 5.0
    with h5py.File(summary["results_h5"]) as f:
        losses = f["eval/val_loss"][()]
    assert losses[-1] <= 5.0 < losses[:-1].min()  # stopped at the first eval below target


def test_reserved_overrides_are_refused_with_the_flag_to_use(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.measure.run", "trainer.steps=5"],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "trainer.steps=5: set by the benchmark; use --steps" in proc.stderr
