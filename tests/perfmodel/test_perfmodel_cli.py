"""`python -m toolkit.perfmodel OVERRIDES` composes the launcher's config and predicts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.config.compose import compose_raw, to_job
from toolkit.perfmodel import layout_from_job, predict_job

REPO = Path(__file__).resolve().parents[2]


def perfmodel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.perfmodel", *args],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_json_output_matches_the_library_for_the_same_overrides():
    overrides = ["model=gpt_1b", "precision=bf16", "hardware=h100", "cluster.tasks_per_node=8"]
    proc = perfmodel("--json", *overrides)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    expected = predict_job(to_job(compose_raw(overrides))).as_dict()
    assert printed["world_size"] == 8
    assert printed["time"]["step_s"] == pytest.approx(expected["time"]["step_s"])
    assert printed["memory"]["peak_bytes"] == pytest.approx(expected["memory"]["peak_bytes"])


def test_table_names_the_dominant_term():
    proc = perfmodel("model=gpt_tiny", "--world", "2")
    assert proc.returncode == 0, proc.stderr
    assert "dominant term" in proc.stdout
    assert "gemm term" in proc.stdout


def test_a_bad_override_is_one_line_naming_the_allowed_options():
    proc = perfmodel("model=gpt_huge")
    assert proc.returncode == 2
    assert "model=gpt_huge: no such option" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_layout_follows_the_job_batch_rules():
    job = to_job(
        compose_raw(["parallel=hsdp", "cluster.tasks_per_node=4", "trainer.global_batch_size=64"])
    )
    layout = layout_from_job(job)
    # 64 sequences over 4 ranks x 1 accumulation step = 16 per rank; 2 replicas of 2 shards
    assert (layout.world_size, layout.micro_batch_size, layout.shard_size) == (4, 16, 2)


def test_a_pipeline_with_fewer_micro_batches_than_stages_is_refused_as_at_launch():
    result = perfmodel(
        "model=gpt_tiny", "parallel.pp=2", "cluster.tasks_per_node=2", "trainer.grad_accum=1"
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: parallel.pp=2: trainer.grad_accum=1 micro-batches")
    assert "Traceback" not in result.stderr


def test_a_7b_model_accumulating_with_grad_sync_last_holds_its_whole_fp32_gradient():
    shape = ["model=gpt_7b", "precision=bf16", "hardware=h100", "cluster.tasks_per_node=8"]
    held = {}
    for mode in ("last", "every"):
        job = to_job(compose_raw([*shape, "trainer.grad_accum=4", f"trainer.grad_sync={mode}"]))
        held[mode] = predict_job(job).memory["accumulated_grads_bytes"] / 2**30
    # 6.87e9 parameters x 4 B on every rank, against their eighth with every micro-step reduced
    assert held["last"] == pytest.approx(25.6, abs=0.05)
    assert held["every"] == pytest.approx(25.6 / 8, abs=0.01)
