"""The live straggler score: an injected slow rank is named while the job runs (event, log
line with its node and the metric), and with exclude_on_requeue its node is marked for the
next requeue; the fast rank is never named."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

from tests.conftest import launch
from toolkit.config.fault import FaultConfig, problems
from toolkit.telemetry.straggler import window_scores


def test_window_scores_are_the_reports_ratio_to_the_per_step_median():
    # Three ranks, four steps: rank 2 takes 1.5x the median every step.
    window = np.array([[1.0, 2.0, 1.0, 2.0], [1.0, 2.0, 1.0, 2.0], [1.5, 3.0, 1.5, 3.0]])
    assert np.allclose(window_scores(window), [0.0, 0.0, 0.5])


def test_the_fault_groups_node_fields_are_checked_at_the_edge():
    assert problems(FaultConfig()) == []
    bad = FaultConfig(
        straggler_action="kill",
        straggler_margin=0,
        straggler_windows=0,
        straggler_window_steps=0,
        fail_node=" ",
    )
    assert problems(bad) == [
        "fault.fail_node='': name a node (e.g. n2) or leave it null",
        "fault.straggler_action=kill: must be one of off, warn, exclude_on_requeue",
        "fault.straggler_margin=0: must be > 0 (0.2 is 20 %)",
        "fault.straggler_windows=0: must be >= 1",
        "fault.straggler_window_steps=0: must be >= 1",
    ]


@pytest.mark.slow
def test_an_injected_straggler_is_named_with_its_node_and_marked_for_exclusion(tmp_path):
    run_dir = tmp_path / "run"
    done = launch(
        "model=gpt_tiny",
        "trainer.steps=30",
        "trainer.log_every=10",
        "trainer.progress=false",
        "data.seq_len=32",
        "fault.straggler_rank=1",
        "fault.straggler_sleep_s=0.05",
        "fault.straggler_window_steps=5",
        "fault.straggler_windows=3",
        "fault.straggler_action=exclude_on_requeue",
        f"hydra.run.dir={run_dir}",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (run_dir / "metrics" / "events-rank0.jsonl").read_text().splitlines()
    found = [e for e in map(json.loads, lines) if e["name"] == "straggler"]
    assert len(found) == 1, found  # rank 1 once; rank 0 never
    attrs = found[0]["attrs"]
    node = socket.gethostname().split(".")[0]
    assert (attrs["straggler_rank"], attrs["node"], attrs["metric"]) == (1, node, "compute_s")
    assert attrs["score"] > 0.2 and attrs["action"] == "exclude_on_requeue"
    # Three windows of five steps after the first step's (empty) vote: flagged at step 16.
    assert found[0]["step"] == 16
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"straggler: rank 1 on node {node} is " in log and "slower in compute_s" in log
    (mark,) = [json.loads(x) for x in (run_dir / "bad_nodes.jsonl").read_text().splitlines()]
    assert (mark["node"], mark["attempt"], mark["source"]) == (node, 0, "straggler")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "completed"  # never stops a healthy job itself
