"""Ctrl-C (SIGINT to the terminal's process group: launcher and ranks) stops the run at the
next step with a committed checkpoint, as a preemption does, and a relaunch resumes it
bitwise; the launcher says which checkpoint is the newest."""

import json
import os
import signal

import pytest

from tests.checkpoint.conftest import CKPT, STEPS, checkpoint_names, launch, logs, losses, wait_for
from toolkit.errors import EXIT_PREEMPTED

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


@pytest.mark.slow
def test_ctrl_c_checkpoints_at_the_next_step_and_a_relaunch_resumes_bitwise(
    tmp_path, reference, start
):
    run_dir = tmp_path / "run"
    job = start(run_dir, *CKPT, "checkpoint.interval_steps=100", "fault.data_delay_s=0.3")
    steps = run_dir / "metrics" / "rank0.jsonl"
    wait_for(lambda: steps.exists() and steps.read_text().strip(), what="the first step")
    os.killpg(job.pid, signal.SIGINT)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 130, out

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_PREEMPTED and summary["steps"] < STEPS
    stopped_at = f"step-{summary['steps']:08d}"
    assert checkpoint_names(run_dir) == [stopped_at]
    assert f"newest committed checkpoint {run_dir / 'checkpoints' / stopped_at}" in out
    assert "KeyboardInterrupt" not in logs(run_dir) + out

    again = launch(run_dir, *CKPT)
    assert again.returncode == 0, again.stderr
    assert losses(run_dir) == reference
