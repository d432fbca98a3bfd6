"""A preempted job never loses its save silently: the final checkpoint is retried once when
it fails, and the job says (in its preemption event and log) whether it committed and which
checkpoint a relaunch resumes from. On Slurm the requeue follows the same facts
(tests/executors/test_preemption.py)."""

from __future__ import annotations

import signal

import pytest

from tests.checkpoint.conftest import events, logs, wait_for
from tests.checkpoint.test_resume import rank_process
from toolkit.errors import EXIT_PREEMPTED, EXIT_SAVE_FAILED

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

LONG = ["checkpoint.enabled=true", "trainer.steps=400", "trainer.log_every=1"]
FULL_DISK = "fault.save_enospc_after_bytes=1000"


def stop_with_usr2(start, run_dir, *overrides, when=None):
    job = start(run_dir, *LONG, *overrides)
    # Rank 1 (the one signalled) has armed its handlers once it recorded a step.
    rank1 = run_dir / "metrics" / "rank1.jsonl"
    wait_for(lambda: rank1.exists() and rank1.read_text().strip(), what="rank 1's first step")
    if when is not None:
        wait_for(when, what="the condition to signal")
    rank_process(job.pid, 1).send_signal(signal.SIGUSR2)
    out, _ = job.communicate(timeout=180)
    return job.returncode, out


@pytest.mark.slow
def test_a_failed_preemption_save_is_retried_and_nothing_committed_is_said(tmp_path, start):
    run_dir = tmp_path / "run"
    code, out = stop_with_usr2(start, run_dir, FULL_DISK)
    assert code == EXIT_SAVE_FAILED, out
    [event] = events(run_dir, "preemption")
    attrs = event["attrs"]
    assert attrs["save_committed"] is False and attrs["save_retried"] is True
    assert attrs["resume_step"] is None and attrs["requeued"] is False
    assert [e["step"] for e in events(run_dir, "checkpoint_failed")] == [event["step"]] * 2
    assert "failed twice and none is committed" in logs(run_dir)


@pytest.mark.slow
def test_when_the_save_fails_twice_the_newest_committed_one_is_named(tmp_path, start):
    run_dir = tmp_path / "run"
    committed = lambda: [e["step"] for e in events(run_dir, "checkpoint")] == [2]  # noqa: E731
    code, out = stop_with_usr2(
        start,
        run_dir,
        FULL_DISK,
        "fault.save_enospc_from_step=3",
        "checkpoint.interval_steps=2",
        when=committed,
    )
    assert code == EXIT_PREEMPTED, out  # a relaunch resumes from step 2
    attrs = events(run_dir, "preemption")[0]["attrs"]
    assert attrs["save_committed"] is False and attrs["resume_step"] == 2
    assert "the newest committed one is step 2" in attrs["requeue_decision"]


@pytest.mark.slow
def test_a_signalled_pipeline_stops_every_stage_at_one_step_and_resumes_bitwise(tmp_path, start):
    """pp=2: a signal to the last stage's rank stops both stages at the same step boundary
    (the votes' all-reduce spans every stage), the final checkpoint commits, and a relaunch
    continues with bitwise the losses of an uninterrupted pipelined run."""
    from tests.checkpoint.conftest import launch, losses

    pipeline = ["cluster.tasks_per_node=2", "parallel.pp=2", "trainer.grad_accum=2"]
    steps = ["trainer.steps=60", "trainer.log_every=1"]
    reference = tmp_path / "reference"
    assert launch(reference, *pipeline, *steps).returncode == 0
    run_dir = tmp_path / "run"
    job = start(run_dir, "checkpoint.enabled=true", *pipeline, *steps)
    rank1 = run_dir / "metrics" / "rank1.jsonl"
    wait_for(lambda: rank1.exists() and rank1.read_text().strip(), what="rank 1's first step")
    rank_process(job.pid, 1).send_signal(signal.SIGUSR2)  # the last stage only
    out, _ = job.communicate(timeout=180)
    assert job.returncode == EXIT_PREEMPTED, out
    [event] = events(run_dir, "preemption")
    stopped_at = event["step"]
    assert event["attrs"]["save_committed"] is True and stopped_at < 60
    for rank in (0, 1):  # both stages ended their last step at the same boundary
        last = (run_dir / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()[-1]
        assert f'"step": {stopped_at},' in last
    done = launch(run_dir, "checkpoint.enabled=true", *pipeline, *steps)
    assert done.returncode == 0, done.stderr[-3000:]
    assert events(run_dir, "restart")[0]["step"] == stopped_at
    assert losses(run_dir) == losses(reference)  # bitwise: same floats, every step
