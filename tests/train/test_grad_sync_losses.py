"""Gradient sync per micro-step: 2 ranks of FSDP2 train the same losses whether they
reduce-scatter every micro-step or only the last, and whether the parameters are gathered
again between micro-steps; the summary says which mode ran."""

from __future__ import annotations

import json

import pytest

from tests.checkpoint.conftest import logs
from tests.conftest import launch, losses

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


@pytest.mark.slow
def test_every_last_and_kept_parameters_train_the_same_losses(tmp_path, tiny) -> None:
    modes = {
        "last": ["trainer.grad_sync=last"],
        "every": ["trainer.grad_sync=every"],
        "every_kept": ["trainer.grad_sync=every", "trainer.reshard_between_micro_steps=false"],
        "auto": [],
    }
    for name, overrides in modes.items():
        run = tmp_path / name
        result = launch(
            *tiny,
            "trainer.steps=4",
            "trainer.grad_accum=2",
            "trainer.micro_batch_size=2",
            *overrides,
            f"hydra.run.dir={run}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
    reference = losses(tmp_path / "last")
    for name in ("every", "every_kept", "auto"):
        assert losses(tmp_path / name) == pytest.approx(reference, rel=1e-4, abs=1e-5), name
    ran = {name: json.loads((tmp_path / name / "summary.json").read_text()) for name in modes}
    assert ran["every"]["grad_sync"] == "every" and ran["last"]["grad_sync"] == "last"
    assert ran["every_kept"]["reshard_between_micro_steps"] is False
    # auto: the performance model's choice, resolved before training and logged on rank 0
    auto = ran["auto"]["grad_sync"]
    assert auto in ("every", "last")
    assert f"grad_sync: {auto} (" in logs(tmp_path / "auto")
    assert "peak" in logs(tmp_path / "auto")  # why: each mode's predicted peak and step
