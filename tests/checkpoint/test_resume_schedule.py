"""What a resume says changed is what runs: a new learning rate or schedule takes effect at
the restored step (the schedule keeps only its position), and the restart event names each
change, old -> new, with whether it needed checkpoint.allow_config_change."""

from __future__ import annotations

import json

import pytest

from tests.checkpoint.conftest import CKPT, events, launch
from toolkit.train.optim import lr_factor

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def logged_lrs(run_dir) -> dict[int, float]:
    """The lr each step ran with (rank 0's metrics; step is 1-based, lr_factor's 0-based)."""
    lines = (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
    return {rec["step"]: rec["lr"] for rec in map(json.loads, lines)}


@pytest.mark.slow
def test_a_new_lr_and_warm_up_take_effect_on_resume_and_are_named(copy_run):
    run_dir = copy_run()  # 8 steps at lr 3e-3, warm-up 20: step 8 checkpointed
    done = launch(
        run_dir,
        *CKPT,
        "checkpoint.allow_config_change=true",
        "optim.lr=1e-3",
        "optim.warmup_steps=4",
        "trainer.steps=12",
        "trainer.log_every=1",
    )
    assert done.returncode == 0, done.stderr
    expected = {s + 1: 1e-3 * lr_factor(s, 12, "cosine", 4, 0.1) for s in range(8, 12)}
    assert logged_lrs(run_dir) == pytest.approx(expected)
    restart = events(run_dir, "restart")[0]["attrs"]
    assert restart["schedule_changed"] == [
        "optim.lr: 0.003 -> 0.001",
        "optim.warmup_steps: 20 -> 4",
        "trainer.steps: 8 -> 12",
    ]
    assert restart["config_change_allowed"] is True
    assert "optim.lr: 0.003 -> 0.001" in restart["changes_needing_permission"]


@pytest.mark.slow
def test_more_steps_need_no_permission_and_the_record_says_so(copy_run):
    run_dir = copy_run()
    done = launch(run_dir, *CKPT, "trainer.steps=10", "trainer.log_every=1")
    assert done.returncode == 0, done.stderr
    restart = events(run_dir, "restart")[0]["attrs"]
    assert restart["config_changed"] == ["trainer.log_every: 10 -> 1", "trainer.steps: 8 -> 10"]
    assert restart["config_change_allowed"] is False  # not set, and not needed:
    assert restart["changes_needing_permission"] == []
    assert restart["schedule_changed"] == ["trainer.steps: 8 -> 10"]
    expected = {s + 1: 3e-3 * lr_factor(s, 10, "cosine", 20, 0.1) for s in (8, 9)}
    assert logged_lrs(run_dir) == pytest.approx(expected)
