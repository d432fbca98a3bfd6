"""The GPU check's ensemble step, run on the CPU with tiny settings: it times one ensemble
step against K separate steps for each K and checks the members' losses against their
separate models' (the GPU path is the same code on CUDA)."""

from __future__ import annotations

import pytest
import torch

from toolkit.measure.gpu_ensemble import ensemble_step, ensemble_summary

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


@pytest.mark.slow
def test_the_ensemble_step_times_each_k_and_checks_the_members_against_separate_models(
    tmp_path,
):
    result = ensemble_step(
        tmp_path, torch.device("cpu"), ks=(1, 2), repeats=1, steps=1, micro_batch=4, models=("mlp",)
    )
    assert result["ok"] and result["members_max_rel_diff"]["mlp"] < 1e-4
    assert [(r["model"], r["k"]) for r in result["rows"]] == [("mlp", 1), ("mlp", 2)]
    for row in result["rows"]:
        assert row["ensemble_step_ms"] > 0 and row["separate_steps_ms"] > 0
        assert row["speedup"] == row["separate_steps_ms"] / row["ensemble_step_ms"]
    (line,) = ensemble_summary(result)
    assert line.startswith("mlp: K=1: ") and ", K=2: " in line
