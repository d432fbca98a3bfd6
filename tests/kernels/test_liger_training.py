"""model.kernels=liger through the real CLI: 2 ranks (gloo, FSDP2), gpt_tiny, Liger's kernels
under Triton's interpreter. The loss falls and follows the torch run's; checkpoints resume
with liger, whether written with liger or with torch; liger where it cannot run is refused
before any rank starts.

Interpreted Triton runs each kernel program in numpy (seconds per step): the runs are 4
steps of 2 x 16 tokens per rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoint.conftest import BASE, checkpoint_names, events, launch, logs, losses
from toolkit.kernels.backend import importable

pytestmark = [
    pytest.mark.skipif(not importable("liger_kernel"), reason="liger-kernel missing"),
    pytest.mark.load_tolerant,  # asserts results, times nothing (scripts/test_suite.py)
]

SHORT = [
    "data.seq_len=16",
    "trainer.steps=4",
    "trainer.global_batch_size=4",
    "checkpoint.enabled=true",
    "checkpoint.interval_steps=2",
]


def run(run_dir: Path, *overrides: str) -> dict[int, float]:
    done = launch(run_dir, *SHORT, *overrides, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return losses(run_dir)


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("torch") / "run"
    run(run_dir, "model.kernels=torch")
    return run_dir


@pytest.fixture(scope="module")
def liger_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("liger") / "run"
    run(run_dir, "model.kernels=liger")
    return run_dir


@pytest.mark.slow  # ~80 s: two launches, one of them interpreted
def test_two_ranks_train_with_liger_and_follow_the_torch_losses(torch_run, liger_run):
    reference, fused = losses(torch_run), losses(liger_run)
    assert sorted(fused) == [1, 2, 3, 4]
    assert fused[4] < fused[1]  # it learns
    for step, loss in reference.items():  # fp32: the kernels reorder sums only
        assert fused[step] == pytest.approx(loss, rel=1e-5)
    assert "kernels: liger (model.kernels=liger on cpu)" in logs(liger_run)
    assert checkpoint_names(liger_run) == ["step-00000002", "step-00000004"]


@pytest.mark.slow  # ~35 s
def test_a_liger_checkpoint_resumes_with_liger(liger_run, tmp_path):
    source = liger_run / "checkpoints" / "step-00000002"
    resumed = run(tmp_path / "run", "model.kernels=liger", f"checkpoint.resume_from={source}")
    assert events(tmp_path / "run", "restart")[0]["step"] == 2
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == pytest.approx(losses(liger_run)[step], rel=1e-6)


@pytest.mark.slow  # ~35 s
def test_a_torch_checkpoint_resumes_with_liger(torch_run, tmp_path):
    """Same state-dict keys, and model.kernels is no change of what is trained: a run
    written with kernels=torch continues with kernels=liger where it left off."""
    source = torch_run / "checkpoints" / "step-00000002"
    resumed = run(tmp_path / "run", "model.kernels=liger", f"checkpoint.resume_from={source}")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == pytest.approx(losses(torch_run)[step], rel=1e-5)


@pytest.mark.slow
def test_the_launcher_refuses_liger_under_tensor_parallelism(tmp_path):
    done = launch(tmp_path / "run", *BASE[:1], "model.kernels=liger", "parallel.tp=2")
    assert done.returncode == 2
    assert "error: model.kernels=liger with parallel.tp=2: tensor parallelism" in done.stderr
    assert not (tmp_path / "run" / "logs").exists()  # no rank started


@pytest.mark.slow
def test_the_launcher_refuses_liger_on_cpu_without_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # tests.checkpoint.conftest.env() copies it
    done = launch(tmp_path / "run", *BASE[:1], "model.kernels=liger")
    assert done.returncode == 2
    assert "error: model.kernels=liger: the ranks run on CPU" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
