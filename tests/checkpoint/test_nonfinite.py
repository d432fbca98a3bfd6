"""A diverging run (NaN/inf loss or grad norm) never applies nor commits that step: it stops
there in one line (trainer.on_nonfinite=stop, the default) or skips the step (skip); its
checkpoints from before stay, and summary.json stays strict JSON."""

import json

import pytest
import torch

from tests.checkpoint.conftest import CKPT, checkpoint_names, launch, losses
from toolkit.checkpoint.export import load_model_state
from toolkit.checkpoint.manifest import verify
from toolkit.errors import EXIT_NONFINITE

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

# lr 1000 x step (warmup): finite at steps 1 and 2, the grad norm is inf at step 3.
DIVERGE = [*CKPT, "checkpoint.interval_steps=1", "optim.lr=1e6", "optim.warmup_steps=1000"]


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
def test_a_diverging_run_stops_at_the_first_non_finite_step_and_keeps_the_finite_checkpoint(
    tmp_path,
):
    run_dir = tmp_path / "run"
    done = launch(run_dir, *DIVERGE, "checkpoint.keep_last=1")
    assert done.returncode == EXIT_NONFINITE
    (line,) = done.stderr.strip().splitlines()
    assert "non-finite loss" in line and "at step 3" in line and "lower optim.lr" in line

    # Nothing from step 3 was committed; retention kept the newest finite checkpoint.
    assert checkpoint_names(run_dir) == ["step-00000002"]
    verify(run_dir / "checkpoints" / "step-00000002")
    summary = strict_json((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_NONFINITE and summary["steps"] == 3


@pytest.mark.slow
def test_skip_leaves_the_weights_as_they_were_and_the_run_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    done = launch(
        run_dir, *DIVERGE, "trainer.on_nonfinite=skip", "trainer.steps=4", "checkpoint.keep_last=3"
    )
    assert done.returncode == 0, done.stderr
    assert "step skipped" in (run_dir / "logs" / "rank0.log").read_text()
    assert sorted(losses(run_dir)) == [1, 2, 3, 4]
    # Steps 3 and 4 were not applied: the weights at step 4 are those of step 2, all finite.
    ckpts = run_dir / "checkpoints"
    at_2, at_4 = (load_model_state(ckpts / f"step-0000000{s}") for s in (2, 4))
    assert at_2.keys() == at_4.keys()
    for name, tensor in at_4.items():
        assert torch.equal(tensor, at_2[name]) and torch.isfinite(tensor).all(), name
    summary = strict_json((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.on_nonfinite=continue", "unknown; allowed: stop, skip, rollback"),
        ("trainer.max_rollbacks=-1", "must be >= 0"),
    ],
)
def test_an_unknown_nonfinite_action_is_refused_before_any_rank_starts(tmp_path, override, message):
    done = launch(tmp_path, override, "launch.dry_run=true")
    assert done.returncode == 2
    assert f"{override}: {message}" in done.stderr
