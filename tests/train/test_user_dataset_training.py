"""Training on your own torch Dataset (data._target_) through the real CLI, 2 gloo ranks:
the loss falls, a run resumed from a checkpoint continues with bitwise the same losses, and
the same checkpoint resumes on one rank. The Dataset lives in a user package outside
toolkit/ (tests/fixtures/userpkg), found by the ranks through PYTHONPATH."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoint.conftest import events, losses
from toolkit.errors import EXIT_NONFINITE
from toolkit.events import read_steps

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

REPO = Path(__file__).resolve().parents[2]
STEPS = 10
BASE = [
    "model=ts_transformer",
    "model.num_series=3",
    "model.num_targets=2",
    "model.num_layers=1",
    "model.dim=32",
    "model.num_heads=2",
    "data=dataset",
    "data._target_=userpkg.datasets.NoisySeries",
    "+data.length=96",
    "+data.window=16",
    "+data.num_series=3",
    "+data.num_targets=2",
    "+data.seq_len=16",
    "+data.num_workers=1",
    "+data.val_fraction=0.25",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=16",
    "optim.warmup_steps=1",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "launch.follow=false",
    "checkpoint.enabled=true",
    "checkpoint.interval_steps=2",
    "checkpoint.keep_last=5",
]


def launch(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests' / 'fixtures'}")
    cmd = [sys.executable, "-m", "toolkit.launch", *BASE, *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("user-data") / "reference"
    done = launch(run_dir)
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.mark.slow
def test_two_ranks_train_on_a_user_dataset_and_the_loss_falls(reference):
    loss = losses(reference)
    assert sorted(loss) == list(range(1, STEPS + 1))
    first, last = [loss[s] for s in (1, 2, 3)], [loss[s] for s in (8, 9, 10)]
    assert sum(last) < 0.7 * sum(first)


@pytest.mark.slow
def test_a_run_resumed_from_a_checkpoint_repeats_the_uninterrupted_losses_bitwise(
    reference, tmp_path
):
    source = reference / "checkpoints" / "step-00000002"
    done = launch(tmp_path / "resumed", f"checkpoint.resume_from={source}")
    assert done.returncode == 0, done.stderr
    resumed = losses(tmp_path / "resumed")
    assert sorted(resumed) == list(range(3, STEPS + 1))  # the data position continues at step 3
    assert resumed == {s: losses(reference)[s] for s in resumed}  # same floats


@pytest.mark.slow
def test_the_checkpoint_resumes_on_another_world_size_with_the_same_batches(reference, tmp_path):
    source = reference / "checkpoints" / "step-00000004"
    done = launch(tmp_path / "one", f"checkpoint.resume_from={source}", "cluster.tasks_per_node=1")
    assert done.returncode == 0, done.stderr
    resumed = losses(tmp_path / "one")
    assert sorted(resumed) == list(range(5, STEPS + 1))
    for step, loss in resumed.items():  # the same samples; only the reduction order differs
        assert loss == pytest.approx(losses(reference)[step], rel=1e-4)
    assert events(tmp_path / "one", "restart")[0]["attrs"]["saved_world_size"] == 2


STREAM = [
    "data._target_=userpkg.datasets.SeriesStream",
    "~data.length",
    "data.val_fraction=0.0",
    "trainer.eval_batches=0",
    "trainer.steps=4",
]


@pytest.mark.slow
def test_an_iterable_dataset_resumes_from_its_saved_stream_state_bitwise(tmp_path):
    done = launch(tmp_path / "stream", *STREAM)
    assert done.returncode == 0, done.stderr
    source = tmp_path / "stream" / "checkpoints" / "step-00000002"
    done = launch(tmp_path / "resumed", *STREAM, f"checkpoint.resume_from={source}")
    assert done.returncode == 0, done.stderr
    reference, resumed = losses(tmp_path / "stream"), losses(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4]
    assert resumed == {s: reference[s] for s in resumed}  # the stream continued where it was


FINITE = [
    "data._target_=userpkg.datasets.CountedStream",
    "~data.length",
    "+data.length=40",
    "+data.shards=itself",
    "data.val_fraction=0.0",
    "trainer.eval_batches=0",
    "checkpoint.interval_steps=4",
]


@pytest.mark.slow
def test_a_finite_stream_runs_epoch_after_epoch_and_resumes_bitwise_on_two_ranks(tmp_path):
    """40 items, 8 a rank per step: epoch 1 starts at step 6. The dataset says it shards
    itself but does not, and rank 0 says so in one line; each rank's stream state is in
    the checkpoint, so the resumed run repeats the losses across the epoch's end."""
    done = launch(tmp_path / "finite", *FINITE)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "finite" / "logs" / "rank0.log").read_text()
    assert log.count("all 2 data-parallel ranks read the same first batch") == 1
    assert "step 10/10  epoch 1  loss" in log
    records = read_steps(tmp_path / "finite" / "metrics" / "rank0.jsonl")
    assert [r["epoch"] for r in records] == [0] * 5 + [1] * 5
    assert json.loads((tmp_path / "finite" / "summary.json").read_text())["epoch"] == 1
    source = tmp_path / "finite" / "checkpoints" / "step-00000004"
    done = launch(tmp_path / "resumed", *FINITE, f"checkpoint.resume_from={source}")
    assert done.returncode == 0, done.stderr
    reference, resumed = losses(tmp_path / "finite"), losses(tmp_path / "resumed")
    assert sorted(resumed) == list(range(5, STEPS + 1))
    assert resumed == {s: reference[s] for s in resumed}


@pytest.mark.slow
def test_a_non_finite_loss_after_non_finite_inputs_names_the_data(tmp_path):
    """Item 20 holds an inf: step 2 (items 16..31, unshuffled) goes non-finite, and the one
    line names the data (rank, count, where in the batch), not the learning rate."""
    done = launch(
        tmp_path,
        "data._target_=userpkg.datasets.FlawedSeries",
        "+data.nonfinite_items=[20]",
        "+data.shuffle=false",
        "trainer.steps=3",
    )
    assert done.returncode == EXIT_NONFINITE, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert "non-finite loss" in line and "at step 2" in line
    assert "the batch of rank 0 holds 1 NaN/inf value(s), the first in micro-batch 0 at [0]" in line
    assert "the data is the cause, not the learning rate" in line and "lower optim.lr" not in line
