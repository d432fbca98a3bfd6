"""trainer.deterministic=true: two runs with the same seed are bitwise equal (not only a
resume), and the run says the mode is on in its first lines. What it sets: torch's
deterministic algorithms, cuBLAS's workspace before CUDA starts, and a fixed NCCL
algorithm and protocol layered with the other NCCL variables (a value of yours wins)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import REPO
from toolkit.config.nccl import NcclConfig
from toolkit.distributed.determinism import enable_deterministic
from toolkit.measure.gpu_determinism import determinism_step
from toolkit.nccl.env import resolve

FIXTURES = REPO / "tests" / "fixtures"


def test_the_fixed_nccl_algorithm_and_protocol_are_layered_with_their_source(tmp_path):
    on = resolve(NcclConfig(), [], {}, 0, tmp_path, deterministic=True)
    assert (on["NCCL_ALGO"].value, on["NCCL_ALGO"].source) == ("Ring", "deterministic")
    assert (on["NCCL_PROTO"].value, on["NCCL_PROTO"].source) == ("Simple", "deterministic")
    yours = resolve(NcclConfig(), [], {"NCCL_ALGO": "Tree"}, 0, tmp_path, deterministic=True)
    assert (yours["NCCL_ALGO"].value, yours["NCCL_ALGO"].source) == ("Tree", "environment")
    off = resolve(NcclConfig(), [], {}, 0, tmp_path)
    assert "NCCL_ALGO" not in off and "NCCL_PROTO" not in off


def test_the_mode_sets_torch_and_cublas_and_says_so():
    environ: dict[str, str] = {}
    try:
        line = enable_deterministic(is_rank0=False, environ=environ)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert environ == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert line.startswith("deterministic mode on (trainer.deterministic=true)")
    kept = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}  # yours is kept
    try:
        enable_deterministic(is_rank0=False, environ=kept)
    finally:
        torch.use_deterministic_algorithms(False)
    assert kept == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_two_runs_with_the_same_seed_are_bitwise_equal(tmp_path, monkeypatch):
    """2 ranks, a user's LSTM on a user's dataset that adds random noise in its DataLoader
    workers (2 per rank): every step's loss and gradient norm equal bit for bit between two
    fresh runs, each saying the mode is on. The GPU check's determinism step, run here on
    the CPU (the GPU adds runs with the mode off, for its cost)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), str(REPO)]))
    model = ["model._target_=userpkg.models.LSTMForecaster", "model.hidden=8"]
    shape = ["model.num_series=4", "model.num_targets=2", "data.num_series=4"]
    data = [
        "data._target_=userpkg.augmented.AugmentedSeries",
        "data.length=256",
        "data.window=16",
        "data.num_targets=2",
        "data.seq_len=16",
        "data.num_workers=2",
    ]
    run = ["trainer.steps=3", "trainer.global_batch_size=8", "trainer.eval_batches=1"]
    quiet = ["trainer.progress=false", "telemetry=off", "seed=7"]
    overrides = [*model, *shape, *data, *run, *quiet]
    result = determinism_step(tmp_path, overrides, order=("on", "on"), warmup=0)
    assert result["errors"] == []
    assert result["runs_on"] == 2 and result["bitwise_equal"] and result["ok"]
