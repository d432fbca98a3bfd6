"""Checkpoints of a pipelined run (4 ranks: pp=2 x dp_shard=2) hold the logical keys: they
resume on the same layout bitwise and without the pipeline ({dp_shard=2}); a
{dp_shard=2} checkpoint resumes on the pipeline. Model, optimizer (Adam's moments: the
resumed losses would drift otherwise) and the exact data position move across."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoint.conftest import CKPT, events, launch, losses

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

PP = ["cluster.tasks_per_node=4", "parallel.pp=2", "parallel.dp_shard=2"]
DP = ["cluster.tasks_per_node=2", "parallel.dp_shard=2"]
KEEP = ["trainer.grad_accum=2", "checkpoint.keep_last=4"]


def finished(run_dir: Path, *overrides: str) -> dict[int, float]:
    done = launch(run_dir, *CKPT, *KEEP, *overrides, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return losses(run_dir)


def resumed(run_dir: Path, source: Path, *overrides: str) -> dict[int, float]:
    step4 = source / "checkpoints" / "step-00000004"
    done = launch(
        run_dir, *CKPT, *KEEP, f"checkpoint.resume_from={step4}", *overrides, timeout_s=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert events(run_dir, "restart")[0]["step"] == 4
    out = losses(run_dir)
    assert sorted(out) == [5, 6, 7, 8]  # the data position continues at step 5
    return out


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory) -> tuple[Path, dict[int, float]]:
    run_dir = tmp_path_factory.mktemp("pipelined")
    return run_dir, finished(run_dir, *PP)


@pytest.mark.slow
def test_a_pipelined_checkpoint_resumes_on_its_layout_bitwise(pipelined, tmp_path) -> None:
    source, reference = pipelined
    after = resumed(tmp_path / "again", source, *PP)
    assert after == {s: reference[s] for s in after}


@pytest.mark.slow
def test_a_pipelined_checkpoint_resumes_without_the_pipeline(pipelined, tmp_path) -> None:
    source, reference = pipelined
    after = resumed(tmp_path / "dp", source, *DP)
    for step, loss in after.items():
        assert loss == pytest.approx(reference[step], abs=1e-5)  # reduction order differs


@pytest.mark.slow
def test_a_data_parallel_checkpoint_resumes_on_the_pipeline(pipelined, tmp_path) -> None:
    _, reference = pipelined
    source = tmp_path / "dp_source"
    plain = finished(source, *DP)
    after = resumed(tmp_path / "pp", source, *PP)
    for step, loss in after.items():
        assert loss == pytest.approx(plain[step], abs=1e-5)
        assert loss == pytest.approx(reference[step], abs=1e-5)
