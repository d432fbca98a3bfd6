"""Your own callbacks and optimizer in a real 2-rank run: a hook from a package outside the
toolkit (tests/fixtures/userpkg) sees every step, reports an eval metric of its own (agreed
over ranks by a collective) into the eval events and summary.json, while torch.optim.SGD,
named by import path, trains on the linear schedule."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from tests.conftest import REPO, launch, losses
from toolkit.train.optim import lr_factor

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

FIXTURES = REPO / "tests" / "fixtures"  # the user's package root, on every rank's path


def user_env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(FIXTURES)])}


def eval_events(run: Path) -> list[dict]:
    lines = (run / "metrics" / "events-rank0.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["name"] == "eval"]


@pytest.mark.slow
def test_a_user_callback_records_steps_and_reports_eval_metrics_with_sgd(tmp_path, tiny):
    run, out = tmp_path / "run", tmp_path / "seen.json"
    callback = f"[{{_target_:userpkg.callbacks.LossWindow,out:'{out}',scale:2.0}}]"
    done = launch(
        *tiny,
        "trainer.log_every=1",
        "trainer.eval_every=4",
        f"trainer.callbacks={callback}",
        "optim=sgd",
        "optim.schedule=linear",
        "optim.warmup_steps=2",
        f"hydra.run.dir={run}",
        env=user_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["steps"] == list(range(1, 9))
    curve = losses(run)
    evals = eval_events(run)
    assert [e["step"] for e in evals] == [4, 8]
    for event, window in zip(evals, (curve[:4], curve[4:]), strict=True):
        metrics = event["attrs"]
        assert metrics["ranks_reporting"] == 2.0  # every rank ran the callback's all-reduce
        assert metrics["train_loss_window"] == pytest.approx(2 * statistics.mean(window))
        assert "val_loss" in metrics
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_loss_window"] == evals[-1]["attrs"]["train_loss_window"]
    # SGD's peak lr 0.1 (conf/optim/sgd.yaml) on the linear schedule, as lr_factor says
    records = [json.loads(line) for line in (run / "metrics" / "rank0.jsonl").open()]
    expected = [0.1 * lr_factor(s, 8, "linear", 2, 0.1) for s in range(8)]
    assert [r["lr"] for r in records] == pytest.approx(expected)


def test_a_callback_that_does_not_import_is_refused_before_any_rank(tmp_path, tiny):
    done = launch(
        *tiny,
        "trainer.callbacks=[{_target_:userpkg.callbacks.Missing}]",
        f"hydra.run.dir={tmp_path / 'run'}",
        env=user_env(),
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: trainer.callbacks[0]._target_=userpkg.callbacks.Missing: ")
    assert "cannot import it" in line
