"""Preemption on the dev Slurm cluster: USR2 before the time limit makes every rank agree,
checkpoint and requeue the job; the requeued job resumes and its losses equal an
uninterrupted run's, bitwise."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
STEPS = 40
COMMON = [
    "model=gpt_tiny",
    "data=text",
    "data.seq_len=32",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=8",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "checkpoint.enabled=true",
    "checkpoint.interval_steps=5",
]


def launch(cluster, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "toolkit.launch", *COMMON, *overrides, f"hydra.run.dir={run_dir}"]
    env = dict(cluster.env, PYTHONPATH=str(REPO))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def losses(run_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    path = run_dir / "metrics" / "rank0.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]
    return out


def events(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "metrics" / "events-rank0.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["name"] == name]


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def job_state(cluster, job_id: str) -> str:
    out = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State").stdout.strip()
    return out.splitlines()[-1] if out else ""


def test_usr2_checkpoints_requeues_and_resumes_bitwise(slurm_cluster, tmp_path):
    reference = tmp_path / "reference"
    done = launch(slurm_cluster, reference, "cluster=slurm", "cluster.time=00:10:00")
    assert done.returncode == 0, done.stdout + done.stderr
    expected = losses(reference)
    assert sorted(expected) == list(range(1, STEPS + 1))

    run_dir = tmp_path / "preempted"
    done = launch(
        slurm_cluster, run_dir, "cluster=slurm", "cluster.time=00:10:00", "launch.detach=true"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)

    # After the first committed checkpoint, signal the job as its time limit would.
    wait_for(lambda: (run_dir / "checkpoints" / "step-00000005").is_dir(), 180, "a checkpoint")
    signalled = slurm_cluster.run("scancel", "--signal=USR2", job_id)
    assert signalled.returncode == 0, signalled.stderr

    wait_for(lambda: events(run_dir, "preemption"), 120, "the preemption checkpoint")
    preemption = events(run_dir, "preemption")[0]
    assert preemption["attrs"]["signal"] == "SIGUSR2"
    assert preemption["attrs"]["requeued"] is True
    # The end time is ~10 minutes away: this is a preemption, not the time limit.
    assert preemption["attrs"]["reason"] == "preemption"

    wait_for(lambda: events(run_dir, "restart"), 240, "the requeued job to resume")
    restart = events(run_dir, "restart")[0]
    assert restart["step"] == preemption["step"]
    assert restart["attrs"]["restart_count"] == 1
    wait_for(lambda: job_state(slurm_cluster, job_id) == "COMPLETED", 300, "job completion")
    assert losses(run_dir) == expected
