"""The dev cluster behaves like a small real Slurm cluster: two nodes, sbatch, srun, sacct."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def sacct_state(cluster, job_id: str, timeout_s: float = 20) -> str:
    """The job's final state as accounting reports it (slurmdbd records it a moment late)."""
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        out = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State").stdout
        state = out.strip()
        if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
            return state
        time.sleep(0.5)
    return state


def test_both_nodes_are_idle_in_the_default_partition(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %P %t").stdout.split("\n")
    rows = sorted(line.split() for line in out if line)
    assert rows == [["n1", "debug*", "idle"], ["n2", "debug*", "idle"]]


def test_a_two_node_step_runs_one_task_on_each_node(slurm_cluster):
    # `hostname` is the same machine for both nodes, so ask slurmd which node it is.
    proc = slurm_cluster.run("srun", "-N2", "--ntasks-per-node=1", "printenv", "SLURMD_NODENAME")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["n1", "n2"]


def test_each_node_fits_two_tasks(slurm_cluster):
    proc = slurm_cluster.run("srun", "-N2", "--ntasks-per-node=2", "printenv", "SLURMD_NODENAME")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["n1", "n1", "n2", "n2"]


def test_node_names_resolve_for_master_addr(slurm_cluster):
    import socket

    assert {socket.gethostbyname(node) for node in slurm_cluster.node_names} == {"127.0.0.1"}


def test_sbatch_wait_completes_and_sacct_reports_completed(slurm_cluster, tmp_path: Path):
    out = tmp_path / "job.out"
    proc = slurm_cluster.run(
        "sbatch", "--wait", "--parsable", "-N2", f"--output={out}",
        "--wrap", "srun printenv SLURMD_NODENAME",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    assert sorted(out.read_text().split()) == ["n1", "n2"]
    assert sacct_state(slurm_cluster, job_id) == "COMPLETED"


def test_sacct_reports_a_failing_job_as_failed(slurm_cluster, tmp_path: Path):
    proc = slurm_cluster.run(
        "sbatch",
        "--wait",
        "--parsable",
        f"--output={tmp_path / 'job.out'}",
        "--wrap",
        "exit 3",
    )
    assert proc.returncode == 3
    assert sacct_state(slurm_cluster, proc.stdout.strip()) == "FAILED"


def test_up_twice_is_a_quick_no_op(slurm_cluster):
    started = time.monotonic()
    proc = slurm_cluster.run(str(slurm_cluster.script), "up")
    assert proc.returncode == 0, proc.stderr
    assert "already up" in proc.stderr
    assert time.monotonic() - started < 5


def test_status_reports_healthy(slurm_cluster):
    proc = slurm_cluster.run(str(slurm_cluster.script), "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("healthy")
    running = {line.split()[0] for line in proc.stdout.splitlines() if "running (pid" in line}
    assert running == {
        "munged",
        "mariadbd",
        "slurmdbd",
        "slurmctld",
        "slurmd-n1",
        "slurmd-n2",
    }


def test_env_exports_slurm_conf(slurm_cluster):
    out = slurm_cluster.run(str(slurm_cluster.script), "env").stdout
    assert out.startswith("export SLURM_CONF=")
    assert out.strip().endswith("slurm.conf")


def test_a_second_cluster_starts_from_nothing_and_down_leaves_no_daemon(slurm_cluster):
    # Its own state dir and ports: the shared cluster other tests use keeps running.
    state_dir = Path(f"/var/tmp/toolkit-dev-cluster-test-{os.getpid()}")
    env = slurm_cluster.env | {
        "TOOLKIT_DEV_CLUSTER_DIR": str(state_dir),
        "TOOLKIT_DEV_CLUSTER_PORT_BASE": "16910",
    }
    script = str(slurm_cluster.script)
    try:
        up = subprocess.run([script, "up"], env=env, capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stderr
        second = env | {"SLURM_CONF": str(state_dir / "etc" / "slurm.conf")}
        step = subprocess.run(
            ["srun", "-N2", "printenv", "SLURMD_NODENAME"],
            env=second, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert sorted(step.stdout.split()) == ["n1", "n2"], step.stderr
        pids = [int(p.read_text()) for p in state_dir.rglob("*.pid")]
        assert len(pids) == 6  # munged, mariadbd, slurmdbd, slurmctld, slurmd x2
        down = subprocess.run([script, "down"], env=env, capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stderr
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
        status = subprocess.run([script, "status"], env=env, capture_output=True, text=True)
        assert status.returncode != 0 and "UNHEALTHY" in status.stdout
    finally:
        subprocess.run([script, "down", "--purge"], env=env, capture_output=True, timeout=60)
    assert not state_dir.exists()
