"""One writer per run directory: a second launch is refused while the first runs, and a
holder that dies (however) leaves no lock behind."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from tests.checkpoint.conftest import (
    CKPT,
    STEPS,
    checkpoint_names,
    env,
    launch,
    losses,
    wait_for,
)
from toolkit.errors import EXIT_CONFIG, EXIT_PREEMPTED
from toolkit.executors import rundir_lock

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

HOLD = (
    "import sys, time; from pathlib import Path; from toolkit.executors import rundir_lock; "
    "rundir_lock.{call}; print('held', flush=True); time.sleep(600)"
)


def holding(run_dir, call: str = "acquire(Path(sys.argv[1]))") -> subprocess.Popen:
    """Another process that holds run_dir's lock until it is killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(call=call), str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert holder.stdout.readline() == "held\n"
    return holder


@pytest.mark.slow
def test_a_second_launch_is_refused_while_the_first_runs_and_the_first_is_intact(
    tmp_path, reference, start
):
    run_dir = tmp_path / "run"
    first = start(run_dir, *CKPT, "fault.data_delay_s=0.3")
    wait_for(lambda: (run_dir / "metrics" / "rank0.jsonl").exists(), what="the first run's steps")

    second = launch(run_dir, *CKPT)
    assert second.returncode == EXIT_CONFIG
    (line,) = second.stderr.strip().splitlines()
    assert f"in use by pid {first.pid} on {socket.gethostname()}" in line

    assert first.wait(timeout=120) == 0
    assert losses(run_dir) == reference
    metrics = (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
    assert len(metrics) == STEPS  # one writer: one line per step

    # Once it ended, the run dir is free again: a relaunch resumes from its checkpoint.
    again = launch(run_dir, *CKPT, f"trainer.steps={STEPS + 2}")
    assert again.returncode == 0, again.stderr
    assert max(losses(run_dir)) == STEPS + 2


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = holding(tmp_path)
    try:
        lock_file = tmp_path / rundir_lock.LOCK_NAME
        assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600
        assert json.loads(lock_file.read_text())["pid"] == holder.pid
        with pytest.raises(rundir_lock.RunDirBusy, match=f"in use by pid {holder.pid} on "):
            rundir_lock.acquire(tmp_path)
    finally:
        holder.kill()  # SIGKILL: no cleanup of its own
        holder.wait()
    rundir_lock.acquire(tmp_path)
    rundir_lock.release(tmp_path)


def test_a_run_dir_recorded_for_a_live_slurm_job_is_refused_until_the_job_ends(tmp_path):
    rundir_lock.record_slurm(tmp_path, "4242")
    states = {"4242": "RUNNING"}
    with pytest.raises(rundir_lock.RunDirBusy, match="Slurm job 4242 .*scancel 4242"):
        rundir_lock.check_slurm(tmp_path, states.get)
    states["4242"] = "COMPLETED"
    rundir_lock.check_slurm(tmp_path, states.get)


def test_rank_0_of_a_slurm_attempt_holds_the_run_dir_for_its_job(tmp_path):
    attempt = holding(tmp_path, "hold_for_attempt(Path(sys.argv[1]), {'SLURM_JOB_ID': '77'})")
    try:
        with pytest.raises(rundir_lock.RunDirBusy, match="in use by Slurm job 77"):
            rundir_lock.acquire(tmp_path)
    finally:
        attempt.kill()  # the attempt is preempted
        attempt.wait()
    # Its requeued attempt (the same job) takes the run dir again.
    rundir_lock.hold_for_attempt(tmp_path, {"SLURM_JOB_ID": "77"})
    rundir_lock.release(tmp_path)
    assert rundir_lock.holder(tmp_path)["slurm_job_id"] == "77"


def free(run_dir) -> bool:
    try:
        rundir_lock.acquire(run_dir)
    except rundir_lock.RunDirBusy:
        return False
    rundir_lock.release(run_dir)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("rank_start", ["exec", "fork"])
def test_ranks_end_with_their_launcher_checkpointed_and_a_relaunch_resumes(
    tmp_path, start, rank_start
):
    run_dir = tmp_path / "run"
    job = start(
        run_dir,
        *CKPT,
        "checkpoint.interval_steps=100",
        "fault.data_delay_s=0.3",
        f"launch.rank_start={rank_start}",
    )
    steps = run_dir / "metrics" / "rank0.jsonl"
    wait_for(lambda: steps.exists() and steps.read_text().strip(), what="the first step")
    assert not free(run_dir)  # the launcher and its ranks hold it
    os.kill(job.pid, signal.SIGKILL)  # the launcher alone; its ranks get SIGTERM from the kernel
    job.wait()
    wait_for(lambda: free(run_dir), timeout_s=60, what="the ranks to end")

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_PREEMPTED and summary["steps"] < STEPS
    assert checkpoint_names(run_dir) == [f"step-{summary['steps']:08d}"]
    again = launch(run_dir, *CKPT)
    assert again.returncode == 0, again.stderr
    assert max(losses(run_dir)) == STEPS
