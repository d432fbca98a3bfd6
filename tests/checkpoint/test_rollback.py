"""trainer.on_nonfinite=rollback: a step that goes non-finite puts every rank back to the
newest committed checkpoint, and training goes on after the bad step's batch; past
trainer.max_rollbacks, or with nothing committed, the run stops as with stop (exit 80).

The weights are corrupted by a user callback (tests/fixtures/userpkg: PoisonWeights), which
sets them to NaN after a step that is not a checkpoint step: the next step's loss is NaN."""

import json
import math
import os
import subprocess

import pytest
import torch

from tests.checkpoint.conftest import CKPT, REPO, checkpoint_names, cli, events, losses
from toolkit.checkpoint.export import load_model_state
from toolkit.errors import EXIT_NONFINITE

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

FIXTURES = REPO / "tests" / "fixtures"  # the user's package, on every rank's path


def launch_poisoned(run_dir, after_steps: list[int], *overrides: str):
    """A 2-rank run of 8 steps, checkpoints every 2, weights set to NaN after `after_steps`."""
    steps = ",".join(map(str, after_steps))
    callback = f"[{{_target_:userpkg.callbacks.PoisonWeights,after_steps:[{steps}]}}]"
    args = cli(
        run_dir,
        *CKPT,
        "checkpoint.keep_last=8",
        "trainer.on_nonfinite=rollback",
        f"trainer.callbacks={callback}",
        *overrides,
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(FIXTURES)]))
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_a_non_finite_step_rolls_back_to_the_last_checkpoint_and_training_finishes(tmp_path):
    run_dir = tmp_path / "run"
    done = launch_poisoned(run_dir, [3])
    assert done.returncode == 0, done.stderr

    # Step 4 went NaN: every rank restored step 2's checkpoint and went on at step 4.
    for rank in (0, 1):
        (event,) = events(run_dir, "rollback", rank)
        assert event["step"] == 4
        assert event["attrs"]["bad_step"] == 4 and event["attrs"]["restored_step"] == 2
        assert event["attrs"]["skipped_steps"] == 2
        assert event["attrs"]["checkpoint"].endswith("step-00000002")
    loss = losses(run_dir)
    assert sorted(loss) == list(range(1, 9))
    assert math.isnan(loss[4])
    assert all(math.isfinite(loss[s]) for s in (5, 6, 7, 8)), loss

    # Step 4's checkpoint holds step 2's weights (its updates after step 2 were discarded),
    # and every checkpoint is finite: nothing from the poisoned state was committed.
    assert checkpoint_names(run_dir) == [f"step-0000000{s}" for s in (2, 4, 6, 8)]
    ckpts = run_dir / "checkpoints"
    at_2, at_4 = (load_model_state(ckpts / f"step-0000000{s}") for s in (2, 4))
    for name, tensor in at_4.items():
        assert torch.equal(tensor, at_2[name]), name
    # ... and the counters, schedule and data position of step 4: the next step (5) trained
    # on the batch after the bad one.
    state = json.loads((ckpts / "step-00000004" / "train_state.json").read_text())
    assert state["step"] == 4 and state["loader"]["next_step"] == 4
    assert state["scheduler"]["last_epoch"] == 4
    at_8 = load_model_state(ckpts / "step-00000008")
    assert all(torch.isfinite(t).all() for t in at_8.values())


@pytest.mark.slow
def test_past_max_rollbacks_the_run_stops_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    done = launch_poisoned(run_dir, [3, 5], "trainer.max_rollbacks=1")
    assert done.returncode == EXIT_NONFINITE
    (line,) = done.stderr.strip().splitlines()
    assert "at step 6, after 1 rollback (trainer.max_rollbacks=1)" in line
    assert "raise trainer.max_rollbacks" in line
    assert [e["attrs"]["bad_step"] for e in events(run_dir, "rollback")] == [4]
    assert checkpoint_names(run_dir) == ["step-00000002", "step-00000004"]


@pytest.mark.slow
def test_with_no_committed_checkpoint_a_rollback_stops_the_run(tmp_path):
    run_dir = tmp_path / "run"
    done = launch_poisoned(run_dir, [1])
    assert done.returncode == EXIT_NONFINITE
    (line,) = done.stderr.strip().splitlines()
    assert "at step 2, and no committed checkpoint to roll back to" in line
    assert events(run_dir, "rollback") == []
    assert checkpoint_names(run_dir) == []
