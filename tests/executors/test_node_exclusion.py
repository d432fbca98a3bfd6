"""Bad nodes on the dev Slurm cluster (three nodes, 2-node jobs): a job that loses n2 is
requeued with n2 excluded, resumes on n1+n3 from its checkpoint, and its losses equal an
uninterrupted run's; exclusion that would leave too few nodes stops the job with one line.

n2 "fails" through `scontrol update NodeName=n2 State=DOWN` while the job runs (Slurm ends
the attempt with NODE_FAIL and requeues it), or through fault.fail_node=n2 (its rank dies
with an uncorrectable ECC error, the job FAILs). The dev cluster's ReturnToService=2 brings
n2 back at once, as a repaired node would come back: the exclusion, not n2's state, keeps
the next attempt off it."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.executors.slurm_jobs import (
    HOLD_AT_STEP_10,
    JOB,
    STEPS,
    TWO_NODES,
    events,
    losses,
    wait_for,
)

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
COMMON = [*JOB, *TWO_NODES]
HOLD = HOLD_AT_STEP_10  # held at step 15 with step 5 committed: time to take n2 away


def command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "toolkit.launch", *COMMON, *overrides, f"hydra.run.dir={run_dir}"]


def attempts(cluster, job_id: str) -> list[tuple[str, str]]:
    """(State, NodeList) of every attempt, as accounting has them."""
    out = cluster.run("sacct", "-n", "-D", "-X", "-P", "-j", job_id, "-o", "State,NodeList")
    return [tuple(line.split("|")) for line in out.stdout.splitlines() if "|" in line]


@pytest.fixture
def n2_back(slurm_cluster) -> Iterator[None]:
    """Whatever happens, n2 is up again afterwards for the other tests."""
    yield
    slurm_cluster.run("scontrol", "update", "NodeName=n2", "State=RESUME")
    states = lambda: slurm_cluster.run("sinfo", "-h", "-n", "n2", "-o", "%t").stdout.strip()  # noqa: E731
    wait_for(lambda: states() in ("idle", "mix", "alloc"), 60, "n2 to be up again")


@pytest.fixture(scope="module")
def expected(slurm_cluster, tmp_path_factory) -> dict[int, float]:
    """Per-step losses of the same job run on the cluster without interruption."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    done = subprocess.run(command(run_dir), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = losses(run_dir)
    assert sorted(out) == list(range(1, STEPS + 1))
    return out


def run_and_down_n2(
    cluster, run_dir: Path, *overrides: str
) -> tuple[subprocess.CompletedProcess, float]:
    """Launch (the launcher follows the job); when the job holds with step 5 committed, set
    n2 DOWN. Returns the launcher's result and when n2 went down."""
    env = dict(cluster.env, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        command(run_dir, *overrides, *HOLD), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ckpt = run_dir / "checkpoints"
        held = lambda: (ckpt / "step-00000005").is_dir() and (ckpt / "step-00000010.tmp").is_dir()  # noqa: E731
        wait_for(held, 180, "the job to hold at its step-10 save")
        downed_at = time.time()
        down = cluster.run("scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=toolkit-test")
        assert down.returncode == 0, down.stderr
        out, err = launcher.communicate(timeout=420)
    finally:
        launcher.kill()
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, out, err), downed_at


def test_a_node_failure_requeues_the_job_without_that_node_and_it_resumes_bitwise(
    slurm_cluster, tmp_path, expected, n2_back
):
    run_dir = tmp_path / "node_fail"
    done, _ = run_and_down_n2(slurm_cluster, run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    assert f"job {job_id}: excluding n2 (NODE_FAIL, node down: toolkit-test)" in done.stderr
    assert attempts(slurm_cluster, job_id) == [("NODE_FAIL", "n[1-2]"), ("COMPLETED", "n[1,3]")]

    record = run_dir / "excluded_nodes.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    doc = json.loads(record.read_text())
    assert doc["exclude"] == ["n2"] and doc["job_id"] == job_id
    (entry,) = doc["nodes"]
    assert (entry["node"], entry["attempt"], entry["source"]) == ("n2", 0, "slurm")
    assert entry["reason"] == "NODE_FAIL, node down: toolkit-test"

    (excluded,) = events(run_dir, "node_excluded")
    assert excluded["attrs"]["node"] == "n2" and excluded["attrs"]["nodes_now"] == ["n1", "n3"]
    (restart,) = events(run_dir, "restart")
    assert restart["step"] == 5 and restart["attrs"]["restart_count"] == 1
    assert losses(run_dir) == expected


def test_a_rank_dying_of_a_hardware_error_requeues_without_its_node(
    slurm_cluster, tmp_path, expected
):
    run_dir = tmp_path / "ecc"
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    faults = ["fault.fail_node=n2", "fault.fail_at_step=12"]
    done = subprocess.run(
        command(run_dir, *faults), env=env, capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    assert (
        f"job {job_id} failed on a bad node: excluding n2 (hardware error: uncorrectable ECC)"
        in done.stdout
    )
    assert attempts(slurm_cluster, job_id)[-1] == ("COMPLETED", "n[1,3]")
    (entry,) = json.loads((run_dir / "excluded_nodes.json").read_text())["nodes"]
    assert (entry["node"], entry["source"], entry["attempt"]) == ("n2", "rank", 0)
    assert losses(run_dir) == expected


def test_exclusion_that_would_leave_too_few_nodes_stops_the_job_with_one_line(
    slurm_cluster, tmp_path, n2_back
):
    # n3 is excluded by the config: without n2 only n1 is left for a 2-node job.
    run_dir = tmp_path / "too_few"
    done, _ = run_and_down_n2(slurm_cluster, run_dir, "cluster.exclude=n3")
    assert done.returncode != 0
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    assert (
        f"error: job {job_id}: excluding n2 (NODE_FAIL, node down: toolkit-test) would leave "
        "1 usable node(s) (n1) for a 2-node job; not requeueing: it could never be scheduled"
    ) in done.stderr
    wait_for(lambda: attempts(slurm_cluster, job_id)[-1][0].startswith("CANCELLED"), 60,
             "accounting to show the job cancelled")  # fmt: skip
    assert events(run_dir, "restart") == []
    assert not (run_dir / "excluded_nodes.json").exists()


def has_hang_injection() -> bool:
    from toolkit.config.fault import FaultConfig

    fields = FaultConfig.__dataclass_fields__
    return all(f in fields for f in ("hang_at_step", "hang_rank", "hang_timeout_s"))


@pytest.mark.skipif(
    not has_hang_injection(), reason="needs the hang watchdog (fault.hang_at_step, hang_rank)"
)
def test_a_rank_hung_on_n2_requeues_the_job_without_n2_and_it_resumes_bitwise(
    slurm_cluster, tmp_path, expected
):
    """Rank 1 (on n2) hangs in a collective after step 12: the watchdog ends the attempt,
    its summary names n2 as the stuck host, the requeue leaves n2 out."""
    run_dir = tmp_path / "hang"
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    faults = ["fault.hang_at_step=12", "fault.hang_rank=1", "fault.hang_timeout_s=20"]
    done = subprocess.run(
        command(run_dir, *faults), env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    assert attempts(slurm_cluster, job_id)[-1] == ("COMPLETED", "n[1,3]")
    (entry,) = json.loads((run_dir / "excluded_nodes.json").read_text())["nodes"]
    assert (entry["node"], entry["source"], entry["attempt"]) == ("n2", "hang", 0)
    assert entry["reason"].startswith("hang: ranks 1 stuck")
    assert losses(run_dir) == expected


def test_a_straggler_marked_for_exclusion_is_left_out_at_the_next_requeue(
    slurm_cluster, tmp_path, expected
):
    """Rank 1 (on n2) is slow every step; with exclude_on_requeue the live score marks n2.
    The job keeps running until it is preempted (USR2); its requeue leaves n2 out."""
    run_dir = tmp_path / "straggler"
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    faults = [
        "fault.straggler_rank=1",
        "fault.straggler_sleep_s=0.3",
        "fault.straggler_window_steps=3",
        "fault.straggler_windows=2",
        "fault.straggler_action=exclude_on_requeue",
    ]
    launcher = subprocess.Popen(
        command(run_dir, *faults), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: events(run_dir, "straggler"), 180, "the straggler event")
        job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
        assert slurm_cluster.run("scancel", "--signal=USR2", job_id).returncode == 0
        out, err = launcher.communicate(timeout=420)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out + err
    straggler = events(run_dir, "straggler")[0]["attrs"]
    assert (straggler["straggler_rank"], straggler["node"]) == (1, "n2")
    preemption = events(run_dir, "preemption")[0]["attrs"]
    assert preemption["requeued"] is True and preemption["excluded_nodes"] == ["n2"]
    assert "excluding n2 (straggler: " in preemption["requeue_decision"]
    assert attempts(slurm_cluster, job_id)[-1] == ("COMPLETED", "n[1,3]")
    (entry,) = json.loads((run_dir / "excluded_nodes.json").read_text())["nodes"]
    assert (entry["node"], entry["source"], entry["attempt"]) == ("n2", "straggler", 0)
    assert losses(run_dir) == expected


def test_a_detached_jobs_next_attempt_records_the_node_failure_itself(
    slurm_cluster, tmp_path, n2_back
):
    """No launcher follows a detached job: Slurm requeues it after NODE_FAIL, and rank 0 of
    the next attempt finds the failed node and records it for the next requeue."""
    run_dir = tmp_path / "detached"
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    done = subprocess.run(
        command(run_dir, "launch.detach=true", *HOLD), env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    ckpt = run_dir / "checkpoints"
    held = lambda: (ckpt / "step-00000005").is_dir() and (ckpt / "step-00000010.tmp").is_dir()  # noqa: E731
    wait_for(held, 180, "the job to hold at its step-10 save")
    down = slurm_cluster.run("scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=detached")
    assert down.returncode == 0, down.stderr
    slurm_cluster.release_requeued(job_id)  # Slurm's requeue after NODE_FAIL, then its hold
    wait_for(lambda: attempts(slurm_cluster, job_id)[-1][0] == "COMPLETED", 300, "completion")
    (entry,) = json.loads((run_dir / "excluded_nodes.json").read_text())["nodes"]
    assert (entry["node"], entry["source"], entry["attempt"]) == ("n2", "slurm", 0)
    assert entry["reason"] == "NODE_FAIL, node down: detached"
    (excluded,) = events(run_dir, "node_excluded")
    assert excluded["attrs"]["node"] == "n2" and excluded["attrs"]["failed_attempt"] == 0
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"job {job_id} attempt 0: excluding n2 (NODE_FAIL" in log
    assert "from the next requeue on" in log
