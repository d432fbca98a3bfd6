"""The GPU validation script's CPU-testable parts; the GPU path itself needs a device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from toolkit.measure.gpu import (
    gpu_telemetry_samples,
    hardware_preset,
    matmul_peak,
    summary_table,
)
from toolkit.telemetry.synthetic import Plan, generate

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_it_says_so_and_exits_cleanly(tmp_path):
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "gpu")],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "no CUDA device visible" in proc.stdout
    assert "nothing was run" in proc.stdout
    assert proc.stderr == ""  # no traceback, no warnings
    assert not (tmp_path / "gpu").exists()


def test_device_names_map_to_datasheet_presets():
    assert hardware_preset("NVIDIA H100 80GB HBM3") == "h100"
    assert hardware_preset("NVIDIA H200") == "h200"
    assert hardware_preset("NVIDIA A100-SXM4-80GB") == "a100"
    assert hardware_preset("NVIDIA GeForce RTX 4090") is None


def test_matmul_peak_counts_two_n_cubed_flops_per_matmul():
    # On CPU with a small matrix: a positive, finite, plausible rate (< 10 TFLOP/s).
    flops = matmul_peak(torch.device("cpu"), torch.float32, n=64, iters=5)
    assert 0 < flops < 1e13


def test_telemetry_gpu_rows_are_counted_from_the_runs_node_files(tmp_path):
    # A node file with 2 GPUs sampled every second for 10 s, written by the real writer.
    generate(tmp_path, Plan(nodes=1, gpus_per_node=2, duration_s=10.0, idle_gap_at_s=None))
    assert gpu_telemetry_samples(tmp_path) == 2 * 10
    assert gpu_telemetry_samples(tmp_path / "no-such-run") == 0


def h200_report(runs: list[dict], telemetry: dict, **more) -> dict:
    """A GPU check's report on an H200 whose NCCL check passed and whose matmul reached
    750 of the datasheet's 989 TFLOP/s: `runs`, `telemetry` and any other section given."""
    return {
        "device": "NVIDIA H200",
        "nccl": {"ok": True, "nccl_version": "2.27.3", "seconds": 1.2},
        "matmul_peak_flops": 7.5e14,
        "datasheet_peak_flops": 9.89e14,
        "runs": runs,
        "telemetry": telemetry,
        **more,
    }


def rendered_summary(report: dict, width: int = 200) -> str:
    """The summary table as the terminal shows it."""
    from rich.console import Console

    console = Console(width=width, record=True)
    console.print(summary_table(report))
    return console.export_text()


def test_summary_table_shows_mfu_memory_verdict_and_failed_runs():
    report = h200_report(
        [
            {
                "name": "gpt_small",
                "compile": False,
                "tokens_per_s": 1.2e6,
                "mfu": 0.30,
                "mfu_measured_peak": 0.40,
                "memory_ratio": 1.15,
            },
            {"name": "gpt_1b", "compile": True, "exit_code": 1, "reason": "exit 1; logs in L"},
        ],
        {"samples": 123, "runs": 1, "runs_with_samples": 1},
    )
    text = rendered_summary(report)
    assert "76% of datasheet 989" in text  # 750 / 989 TFLOP/s
    assert "MFU 40.0% of measured peak, 30.0% of datasheet" in text
    assert "memory meas/pred 1.15 (outside 10%)" in text
    assert "FAILED" in text and "exit 1; logs in L" in text
    assert "123 GPU rows" in text


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_passes_on_a_cuda_machine_within_10_minutes(tmp_path):
    started = time.time()
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "gpu")],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=660,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.time() - started < 600
    report = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    assert report["nccl"]["ok"]
    assert report["telemetry"]["runs_with_samples"] == 3
    assert {(r["name"], r["compile"]) for r in report["runs"]} == {
        ("gpt_small", False),
        ("gpt_small", True),
        ("gpt_1b", False),  # its compiled run trimmed to make room for the overhead step
    }
    # the overhead step: every quant configuration ran, graphed and eager, with NVML; both
    # training runs said TF32 on, fused AdamW and CUDA graphs as asked (speed-ups reported)
    quant = report["overhead"]["quant"]
    assert len(quant["results"]) == 3 * 2 * 2 * 2
    assert all(r["samples_per_s"] > 0 and r["gpu_util_pct"] is not None for r in quant["results"])
    assert {r["mode"] for r in quant["results"]} == {"eager", "graphed"}
    graphs = report["overhead"]["graphs"]
    assert [r["cuda_graphs"] for r in graphs["runs"]] == ["off", "on"]
    assert graphs["graphs_speedup"] > 0
    # the planner's three picks of gpt_1b, each measured (whether the order holds is
    # reported, not asserted: that is what the check is for)
    plans = report["plans"]
    assert [p["rank"] for p in plans["picks"]][::2] == [1, plans["ranked"]]
    assert all(p["measured_tokens_per_s"] > 0 for p in plans["picks"])
    assert plans["compared"] == 3 and -1.0 <= plans["spearman"] <= 1.0
    assert "planner order" in proc.stdout
    assert "passed in" in proc.stdout[-1000:]  # the table's caption, printed last
