"""A resumed run means what it meant: the checkpoint's global batch and data order survive a
new world size, a config change that alters what is trained is refused (listing every
changed key) unless allowed, and every way of stopping saves a final checkpoint."""

from __future__ import annotations

import json

import pytest

from tests.checkpoint.conftest import (
    CKPT,
    checkpoint_names,
    events,
    launch,
    losses,
)
from toolkit.checkpoint.manifest import verify
from toolkit.config.shape import split_global_batch
from toolkit.errors import EXIT_CHECKPOINT_UNUSABLE, EXIT_RESUME_REFUSED

# Real launches whose losses, files and refusals are compared; nothing here is timed, so the
# slow ones run beside the Slurm tests (scripts/test_suite.py).
pytestmark = pytest.mark.load_tolerant

UNSET_GLOBAL = "trainer.global_batch_size=null"  # the default: micro x accum x world
KEEP_4 = "checkpoint.keep_every=4"  # the step-4 checkpoint outlives retention


def steps_tokens(run_dir) -> set[int]:
    lines = (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
    return {json.loads(line)["tokens"] for line in lines}


def test_the_global_batch_is_split_over_any_world_that_divides_it():
    assert split_global_batch(8, 4, 1) == (2, 1)
    assert split_global_batch(8, 2, 1) == (4, 1)
    assert split_global_batch(16, 2, 3) == (2, 4)  # the accumulation nearest to 3 that divides
    assert split_global_batch(8, 3, 1) is None


@pytest.mark.slow
def test_a_two_rank_run_without_a_global_batch_keeps_it_on_four_ranks(reference, tmp_path):
    """2 ranks x micro 4 = 8 sequences a step; resumed on 4 ranks with the same micro-batch
    setting (which alone would make 16), the checkpoint's 8 win: micro-batch 2."""
    source = tmp_path / "two"
    done = launch(source, *CKPT, KEEP_4, UNSET_GLOBAL, "trainer.micro_batch_size=4")
    assert done.returncode == 0, done.stderr
    four = tmp_path / "four"
    done = launch(
        four,
        *CKPT,
        UNSET_GLOBAL,
        "trainer.micro_batch_size=4",
        "cluster.tasks_per_node=4",
        f"checkpoint.resume_from={source / 'checkpoints' / 'step-00000004'}",
    )
    assert done.returncode == 0, done.stderr
    restart = events(four, "restart")[0]["attrs"]
    assert (restart["saved_world_size"], restart["world_size"]) == (2, 4)
    assert restart["global_batch_size"] == 8
    assert steps_tokens(four) == {8 * 32}  # 8 sequences of 32 tokens every step
    resumed = losses(four)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step, loss in resumed.items():  # the same windows; only the reduction order differs
        assert loss == pytest.approx(reference[step], abs=1e-4)


@pytest.mark.slow
def test_a_four_rank_run_without_a_global_batch_keeps_it_on_two_ranks(reference, tmp_path):
    source = tmp_path / "four"
    done = launch(
        source,
        *CKPT,
        KEEP_4,
        UNSET_GLOBAL,
        "trainer.micro_batch_size=2",
        "cluster.tasks_per_node=4",
    )
    assert done.returncode == 0, done.stderr
    two = tmp_path / "two"
    done = launch(
        two,
        *CKPT,
        UNSET_GLOBAL,
        "trainer.micro_batch_size=2",  # alone: 2 x 2 = 4 sequences a step
        f"checkpoint.resume_from={source / 'checkpoints' / 'step-00000004'}",
    )
    assert done.returncode == 0, done.stderr
    assert events(two, "restart")[0]["attrs"]["global_batch_size"] == 8
    assert steps_tokens(two) == {8 * 32}
    for step, loss in losses(two).items():
        assert loss == pytest.approx(reference[step], abs=1e-4)


@pytest.mark.slow
def test_a_change_of_what_is_trained_is_refused_in_one_line_before_any_weight(copy_run):
    run_dir = copy_run()
    done = launch(run_dir, *CKPT, "optim.lr=0.01", "seed=7", "trainer.steps=10")
    assert done.returncode == EXIT_RESUME_REFUSED
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot resume from ")
    assert "optim.lr: 0.003 -> 0.01" in line and "seed: 0 -> 7" in line
    assert "trainer.steps" not in line  # harmless: allowed
    assert "checkpoint.allow_config_change=true" in line
    assert "Traceback" not in done.stderr
    assert losses(run_dir) == {}
    verify(run_dir / "checkpoints" / "step-00000008")  # untouched


@pytest.mark.slow
def test_allowed_and_harmless_changes_resume_and_are_recorded(copy_run):
    run_dir = copy_run()
    done = launch(
        run_dir,
        *CKPT,
        "optim.lr=0.01",
        "checkpoint.allow_config_change=true",
        "trainer.steps=10",
        "trainer.log_every=1",
    )
    assert done.returncode == 0, done.stderr
    restart = events(run_dir, "restart")[0]
    assert restart["step"] == 8
    changed = restart["attrs"]["config_changed"]
    assert "optim.lr: 0.003 -> 0.01" in changed
    assert "trainer.steps: 8 -> 10" in changed and "trainer.log_every: 10 -> 1" in changed
    assert restart["attrs"]["config_change_allowed"] is True
    assert sorted(losses(run_dir)) == [9, 10]


@pytest.mark.slow
def test_a_corrupt_checkpoint_without_fallback_ends_in_one_line(copy_run):
    run_dir = copy_run()
    shard = run_dir / "checkpoints" / "step-00000008" / "__1_0.distcp"
    with open(shard, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    done = launch(run_dir, *CKPT, "checkpoint.on_corrupt=fail")
    assert done.returncode == EXIT_CHECKPOINT_UNUSABLE
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot resume: ") and str(shard) in line
    assert "checkpoint.on_corrupt" in line  # what to do
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(["trainer.time_budget_s=0.001"], id="time-budget"),
        pytest.param(["trainer.eval_every=2", "trainer.target_val_loss=100"], id="target-loss"),
    ],
)
@pytest.mark.slow
def test_stopping_early_saves_a_final_checkpoint_like_the_last_step(tmp_path, stop):
    run_dir = tmp_path / "run"
    done = launch(run_dir, "checkpoint.enabled=true", *stop)
    assert done.returncode == 0, done.stderr
    stopped_at = max(losses(run_dir))
    assert stopped_at < 8
    assert checkpoint_names(run_dir) == [f"step-{stopped_at:08d}"]
    verify(run_dir / "checkpoints" / f"step-{stopped_at:08d}")
