"""The dev cluster behaves like a small real Slurm cluster: three nodes (the tests' fixture
asks for them; `up --nodes N`), sbatch, srun, sacct."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DEV_CLUSTER

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


def test_every_node_is_idle_in_the_default_partition(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %P %t").stdout.split("\n")
    rows = sorted(line.split() for line in out if line)
    assert rows == [["n1", "debug*", "idle"], ["n2", "debug*", "idle"], ["n3", "debug*", "idle"]]


def test_a_three_node_step_runs_one_task_on_each_node(slurm_cluster):
    proc = slurm_cluster.run("srun", "-N3", "printenv", "SLURMD_NODENAME")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["n1", "n2", "n3"]


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


@pytest.mark.parametrize("count", ["0", "17", "two"])
def test_up_refuses_a_node_count_out_of_range(count):
    up = subprocess.run([DEV_CLUSTER, "up", "--nodes", count], capture_output=True, text=True)
    assert up.returncode == 1
    assert f"node count '{count}': must be a whole number from 1 to 16" in up.stderr


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
        "slurmd-n3",
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
        # Private to root, with a munge key and database password of its own.
        assert (state_dir.stat().st_uid, stat.S_IMODE(state_dir.stat().st_mode)) == (0, 0o711)
        own = private_files(state_dir)
        shared = private_files(Path(slurm_cluster.env["SLURM_CONF"]).parents[1])
        munge_uid = int(subprocess.run(["id", "-u", "munge"], capture_output=True).stdout)
        assert own["munge.key"][:2] == (munge_uid, 0o400)
        assert own["slurmdbd.pass"][:2] == (0, 0o600)
        assert own["slurmdbd.conf"][1] == 0o600
        password = own["slurmdbd.pass"][2].decode()
        assert (
            len(password) >= 32 and f"StoragePass={password}\n" in own["slurmdbd.conf"][2].decode()
        )
        for name in ("munge.key", "slurmdbd.pass"):
            assert own[name][2] != shared[name][2], f"{name} is the shared cluster's"
        # Grown to three nodes: slurmctld and the slurmds restart with the new node list.
        up = subprocess.run(
            [script, "up", "--nodes", "3"], env=env, capture_output=True, text=True, timeout=180
        )
        assert up.returncode == 0 and "node count 2 -> 3" in up.stderr, up.stderr
        step = subprocess.run(
            ["srun", "-N3", "printenv", "SLURMD_NODENAME"],
            env=second, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert sorted(step.stdout.split()) == ["n1", "n2", "n3"], step.stderr
        # Without --nodes, 'up' keeps the count the state dir has.
        again = subprocess.run([script, "up"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "already up" in again.stderr, again.stderr
        pids = [int(p.read_text()) for p in state_dir.rglob("*.pid")]
        live = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        assert len(live) == 7  # munged, mariadbd, slurmdbd, slurmctld, slurmd x3
        down = subprocess.run([script, "down"], env=env, capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stderr
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
        status = subprocess.run([script, "status"], env=env, capture_output=True, text=True)
        assert status.returncode != 0 and "UNHEALTHY" in status.stdout
    finally:
        subprocess.run([script, "down", "--purge"], env=env, capture_output=True, timeout=60)
    assert not state_dir.exists()


def private_files(state_dir: Path) -> dict[str, tuple[int, int, bytes]]:
    """Owner, mode and content of what must stay secret in a state dir."""
    return {
        name: (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode), path.read_bytes())
        for name, path in {
            "munge.key": state_dir / "munge" / "munge.key",
            "slurmdbd.pass": state_dir / "etc" / "slurmdbd.pass",
            "slurmdbd.conf": state_dir / "etc" / "slurmdbd.conf",
        }.items()
    }


@pytest.fixture
def bad_state_dir() -> Iterator[Path]:
    path = Path(f"/var/tmp/toolkit-dev-cluster-bad-{os.getpid()}")
    yield path
    if path.is_symlink():
        path.unlink()
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="scripts/dev-cluster runs as root")
@pytest.mark.parametrize(
    ("owner", "mode", "message"),
    [
        (65534, 0o700, "is owned by uid 65534, not root"),
        (0, 0o777, "has mode 777, writable by group or others"),
        (0, 0o730, "has mode 730, writable by group or others"),
    ],
)
def test_up_refuses_a_state_dir_another_user_could_change(bad_state_dir, owner, mode, message):
    # Whoever can write there can swap the munge key, the configs or the daemons' files.
    bad_state_dir.mkdir()
    os.chown(bad_state_dir, owner, owner)
    bad_state_dir.chmod(mode)
    env = os.environ | {"TOOLKIT_DEV_CLUSTER_DIR": str(bad_state_dir)}
    up = subprocess.run([DEV_CLUSTER, "up"], env=env, capture_output=True, text=True, timeout=30)
    assert up.returncode == 1
    assert message in up.stderr and "state dir" in up.stderr
    assert list(bad_state_dir.iterdir()) == [], "nothing is written or started"


@pytest.mark.skipif(os.geteuid() != 0, reason="scripts/dev-cluster runs as root")
def test_up_refuses_a_state_dir_that_is_a_symlink(bad_state_dir, tmp_path):
    bad_state_dir.symlink_to(tmp_path)
    env = os.environ | {"TOOLKIT_DEV_CLUSTER_DIR": str(bad_state_dir)}
    up = subprocess.run([DEV_CLUSTER, "up"], env=env, capture_output=True, text=True, timeout=30)
    assert up.returncode == 1 and "is a symlink" in up.stderr
    assert list(tmp_path.iterdir()) == []
