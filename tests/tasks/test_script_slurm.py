"""Your own script on the dev Slurm cluster, 2 nodes: from plain sbatch (jobs/script.sbatch)
uninterrupted, and through `toolkit.launch script.path=... cluster=slurm` with USR2 mid-run:
the script saves through toolkit.session, rank 0 requeues the job under the restart cap, the
next attempt resumes from the checkpoint and its losses equal the uninterrupted run's. An
unmodified DDP script whose rank on the second node dies stops the job with that rank's
error; one whose rank there hangs is named, dumped and ends the job with exit 79."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.executors.slurm_jobs import losses, wait_for
from tests.executors.test_node_exclusion import attempts
from toolkit.cli.rundir import read_run
from toolkit.errors import EXIT_HANG

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SESSION = str(REPO / "tests" / "fixtures" / "scripts" / "session_train.py")
STEPS = 16
SCRIPT = [f"script.path={SESSION}", f"script.args=[--steps,{STEPS},--sleep-s,0.4]"]


def cluster_env(cluster) -> dict[str, str]:
    return dict(cluster.env, PYTHONPATH=str(REPO), TOOLKIT_PYTHON=sys.executable)


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, tmp_path_factory) -> Path:
    """The script on 2 nodes from plain sbatch, run to its end (`sbatch --wait`)."""
    out = tmp_path_factory.mktemp("sbatch")
    run_dir = out / "run"
    done = subprocess.run(
        ["sbatch", "--wait", "-N2", "--ntasks-per-node=1", "--time=00:05:00",
         f"--output={out}/slurm-%j.out", "jobs/script.sbatch", *SCRIPT,
         f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=cluster_env(slurm_cluster), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    logs = "".join(p.read_text() for p in out.glob("slurm-*.out"))
    assert done.returncode == 0, done.stdout + done.stderr + logs[-3000:]
    return run_dir


def test_plain_sbatch_runs_the_script_on_two_nodes_with_telemetry(uninterrupted):
    assert sorted(losses(uninterrupted)) == list(range(1, STEPS + 1))
    nodes = sorted(p.name for p in (uninterrupted / "telemetry").glob("node-*-attempt0.h5"))
    assert len(nodes) == 2, nodes  # one agent per node
    assert (uninterrupted / "logs" / "rank1.log").is_file()


def test_usr2_saves_requeues_and_resumes_with_the_uninterrupted_losses(
    slurm_cluster, tmp_path, uninterrupted
):
    run_dir = tmp_path / "preempted"
    env = cluster_env(slurm_cluster)
    done = subprocess.run(
        [sys.executable, "-m", "toolkit.launch", *SCRIPT, "cluster=slurm", "cluster.nodes=2",
         "cluster.time=00:10:00", "launch.detach=true", f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    wait_for(lambda: len(losses(run_dir)) >= 3, 180, "the script's third step")
    assert slurm_cluster.run("scancel", "--signal=USR2", job_id).returncode == 0

    wait_for(lambda: list((run_dir / "checkpoints").glob("rank*.pt")), 60, "the script's save")
    slurm_cluster.release_requeued(job_id)
    wait_for(lambda: attempts(slurm_cluster, job_id)[-1][0] == "COMPLETED", 300, "completion")
    assert [state for state, _ in attempts(slurm_cluster, job_id)] == ["REQUEUED", "COMPLETED"]
    out = "".join(p.read_text() for p in (run_dir / "slurm").glob("*_0_log.out"))
    saved = int(re.search(r"stopping at step (\d+): saved", out).group(1))
    assert f"resumed at step {saved} (attempt 1)" in out
    assert saved < STEPS
    assert losses(run_dir) == losses(uninterrupted)
    # The requeue is a restart for `status` (the rank-0 wrapper's restart event).
    events = (run_dir / "metrics" / "events-rank0.jsonl").read_text().splitlines()
    assert [json.loads(e)["attempt"] for e in events if '"restart"' in e] == [1]
    assert read_run(run_dir, ask_slurm=False).attempts == 2


DDP = str(REPO / "tests" / "fixtures" / "scripts" / "ddp_train.py")


def launch_script(cluster, run_dir: Path, args: str, *overrides: str):
    return subprocess.run(
        [sys.executable, "-m", "toolkit.launch", f"script.path={DDP}", f"script.args={args}",
         "cluster=slurm", "cluster.nodes=2", "cluster.time=00:05:00", *overrides,
         f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=cluster_env(cluster), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_rank_that_dies_on_the_second_node_stops_the_job_with_its_error(slurm_cluster, tmp_path):
    done = launch_script(
        slurm_cluster, tmp_path / "run", "[--steps,200,--sleep-s,0.2,--fail-rank,1,--fail-at,3]"
    )
    assert done.returncode != 0
    assert "rank 1 failed" in done.stderr, done.stderr[-3000:]
    assert "injected failure on rank 1 at step 3" in done.stderr
    out = "".join(p.read_text() for p in (tmp_path / "run" / "slurm").glob("*_0_log.out"))
    assert "step 2 loss" in out and "step 199 loss" not in out  # stopped there, not at its end
    # srun's SIGTERM to rank 0 after rank 1 died is no preemption: the job is not requeued
    # to crash again (it was, checkpoint.max_restarts times, before the failure was recorded).
    job_id = re.search(r"submitted Slurm job (\d+)", done.stdout).group(1)
    assert [state for state, _ in attempts(slurm_cluster, job_id)] == ["FAILED"]


def test_a_hung_rank_on_the_second_node_is_named_dumped_and_the_job_ends_79(
    slurm_cluster, tmp_path
):
    run_dir = tmp_path / "run"
    done = launch_script(
        slurm_cluster,
        run_dir,
        "[--steps,200,--hang-rank,1,--hang-at,3]",
        "fault.hang_timeout_s=8",
        "fault.hang_startup_timeout_s=120",
    )
    assert done.returncode == EXIT_HANG, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("hang: rank"), line
    assert "1" in line.split(" on ")[0]  # rank 1 is named (alone, or with its waiting peer)
    (hang,) = (run_dir / "hangs").glob("2*")
    assert 'ddp_train.py", line' in (hang / "stacks-rank1.txt").read_text()
