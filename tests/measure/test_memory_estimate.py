"""The memory estimate against the process's resident memory on CPU.

A ~77M-parameter model on one rank (fp32): parameters 308 MB, AdamW state 616 MB. RSS is
measured through the real benchmark path (task=bench_train's memory probes) with
--exact-rss, which stops glibc from keeping freed blocks resident."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_parameter_and_optimizer_memory_within_10_percent_of_rss_growth(tmp_path):
    out = tmp_path / "mem"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.measure.run",
            "--exact-rss",
            "--warmup",
            "0",
            "--steps",
            "1",
            "--out",
            str(out),
            "model=gpt_small",
            "model.dim=1024",
            "model.num_layers=6",
            "model.num_heads=8",
            "data.seq_len=32",
            "trainer.micro_batch_size=1",
            "cluster.tasks_per_node=1",
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    prediction = json.loads((out / "bench" / "result.json").read_text())
    assert prediction == summary
    from toolkit.config.compose import load_job
    from toolkit.perfmodel import predict_job

    memory = predict_job(load_job(out / "config.yaml"), world=1).memory
    # After step 1: parameters + AdamW moments are live, gradients were freed (set_to_none).
    predicted_state = memory["params_bytes"] + memory["optimizer_bytes"]
    assert summary["persistent_bytes"] == pytest.approx(predicted_state, rel=0.10)
    # Peak: the optimizer step (params + grads + AdamW + one temporary) dominates here.
    assert summary["peak_memory_growth_bytes"] == pytest.approx(memory["peak_bytes"], rel=0.10)
