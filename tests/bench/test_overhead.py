"""`python -m toolkit.bench.overhead`: toolkit step vs a bare FSDP2 loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.bench.overhead import step_seconds

REPO = Path(__file__).resolve().parents[2]


def test_step_time_is_the_median_after_warmup():
    # start at 0; steps end at 5 (warm-up), 6, 7, 9, 10: durations 5 | 1, 1, 2, 1
    assert step_seconds([0.0, 5.0, 6.0, 7.0, 9.0, 10.0], warmup=1) == 1.0


@pytest.mark.slow
def test_overhead_benchmark_reports_a_ratio_per_repetition(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.bench.overhead",
            "--reps",
            "2",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--out",
            str(tmp_path),
            "model=gpt_tiny",
        ],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["reps"]) == 2
    assert all(r["ratio"] == r["toolkit_step_s"] / r["bare_step_s"] for r in result["reps"])
    # The checkpoint and preemption hooks are measured: armed against not built at all.
    reps = result["reps"]
    assert all(r["hook_ratio"] == r["toolkit_step_s"] / r["toolkit_no_ckpt_step_s"] for r in reps)
    assert {tuple(r["order"]) for r in reps} == {
        ("toolkit", "no_ckpt", "bare"),
        ("no_ckpt", "bare", "toolkit"),
    }
    assert result["world_size"] == 2
    assert "model=gpt_tiny" in result["overrides"]
