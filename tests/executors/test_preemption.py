"""Preemption on the dev Slurm cluster: USR2 before the time limit makes every rank agree,
checkpoint and requeue the job; the requeued job resumes and its losses equal an
uninterrupted run's, bitwise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.executors.slurm_jobs import JOB, STEPS, events, losses, wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
COMMON = JOB

# The job trains 40 steps in about a second: hold it long enough to be signalled mid-run. The
# writer of the step-5 save sleeps 5 s before each file it opens, so the loop waits for that
# save at step 10 (one save in flight); losses are unaffected.
HOLD = ["fault.save_stall_step=5", "fault.save_stall_s=5"]


def launch(cluster, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "toolkit.launch", *COMMON, *overrides, f"hydra.run.dir={run_dir}"]
    env = dict(cluster.env, PYTHONPATH=str(REPO))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def job_state(cluster, job_id: str) -> str:
    out = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State").stdout.strip()
    return out.splitlines()[-1] if out else ""


def submit_and_signal_while_held(cluster, run_dir: Path, *overrides: str) -> str:
    """Submit the job detached; while it is held at its step-5 save, send USR2 as its time
    limit would. Returns the job id."""
    done = launch(
        cluster,
        run_dir,
        "cluster=slurm",
        "cluster.time=00:10:00",
        "launch.detach=true",
        *overrides,
        *HOLD,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    wait_for(lambda: (run_dir / "checkpoints" / "step-00000005.tmp").is_dir(), 180, "a save")
    signalled = cluster.run("scancel", "--signal=USR2", job_id)
    assert signalled.returncode == 0, signalled.stderr
    return job_id


@pytest.fixture(scope="module")
def expected(slurm_cluster, tmp_path_factory) -> dict[int, float]:
    """Per-step losses of the same job run on the cluster without interruption."""
    reference = tmp_path_factory.mktemp("reference") / "run"
    done = launch(slurm_cluster, reference, "cluster=slurm", "cluster.time=00:10:00")
    assert done.returncode == 0, done.stdout + done.stderr
    out = losses(reference)
    assert sorted(out) == list(range(1, STEPS + 1))
    return out


def test_usr2_checkpoints_requeues_and_resumes_bitwise(slurm_cluster, tmp_path, expected):
    run_dir = tmp_path / "preempted"
    job_id = submit_and_signal_while_held(slurm_cluster, run_dir)

    wait_for(lambda: events(run_dir, "preemption"), 120, "the preemption checkpoint")
    preemption = events(run_dir, "preemption")[0]
    assert preemption["attrs"]["signal"] == "SIGUSR2"
    assert preemption["attrs"]["requeued"] is True
    # The end time is ~10 minutes away: this is a preemption, not the time limit.
    assert preemption["attrs"]["reason"] == "preemption"

    slurm_cluster.release_requeued(job_id)
    wait_for(lambda: events(run_dir, "restart"), 240, "the requeued job to resume")
    restart = events(run_dir, "restart")[0]
    assert restart["step"] == preemption["step"]
    assert restart["attrs"]["restart_count"] == 1
    wait_for(lambda: job_state(slurm_cluster, job_id) == "COMPLETED", 300, "job completion")
    assert losses(run_dir) == expected


def test_the_launcher_follows_a_job_through_its_requeue_to_the_end(
    slurm_cluster, tmp_path, expected
):
    run_dir = tmp_path / "followed"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.launch",
        *COMMON,
        "cluster=slurm",
        "cluster.time=00:10:00",
        *HOLD,
        f"hydra.run.dir={run_dir}",
    ]
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "step-00000005.tmp").is_dir(), 180, "a save")
        job_id = next(p.name.split("_")[0] for p in (run_dir / "slurm").glob("*_0_log.out"))
        assert slurm_cluster.run("scancel", "--signal=USR2", job_id).returncode == 0
        out, err = launcher.communicate(timeout=420)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out + err
    assert f"job {job_id} requeued (restart 1); following it until it ends" in out
    assert f"job {job_id} COMPLETED" in out
    assert events(run_dir, "restart")[0]["attrs"]["restart_count"] == 1
    assert losses(run_dir) == expected


def test_a_preempted_job_whose_save_failed_is_not_requeued_to_start_over(slurm_cluster, tmp_path):
    """Every save fails (a full disk): after the preemption save and its retry fail, with no
    older checkpoint, a requeue would restart from step 0; the job stops instead and says so."""
    run_dir = tmp_path / "full"
    job_id = submit_and_signal_while_held(
        slurm_cluster, run_dir, "fault.save_enospc_after_bytes=1000"
    )

    wait_for(lambda: events(run_dir, "preemption"), 120, "the preemption event")
    attrs = events(run_dir, "preemption")[0]["attrs"]
    assert attrs["save_committed"] is False and attrs["save_retried"] is True
    assert attrs["requeued"] is False and attrs["resume_step"] is None
    assert "it would start from scratch" in attrs["requeue_decision"]
    wait_for(lambda: job_state(slurm_cluster, job_id) == "FAILED", 120, "the job to fail")
    assert events(run_dir, "restart") == []
