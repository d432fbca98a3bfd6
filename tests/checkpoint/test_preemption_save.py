"""A preempted job never loses its save silently: the final checkpoint is retried once when
it fails, and the job says (in its preemption event and log) whether it committed and which
checkpoint a relaunch resumes from. On Slurm the requeue follows the same facts
(tests/executors/test_preemption.py)."""

from __future__ import annotations

import signal

from tests.checkpoint.conftest import events, logs, wait_for
from tests.checkpoint.test_resume import rank_process
from toolkit.errors import EXIT_PREEMPTED, EXIT_SAVE_FAILED

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
