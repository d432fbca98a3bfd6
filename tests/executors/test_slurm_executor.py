"""`python -m toolkit.launch cluster=slurm` on the real dev cluster: what a user sees.

Every run uses the tiny model on synthetic tokens for a few steps, so each test takes seconds
of compute; most of the time is Python start-up on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from toolkit.config.compose import load_job
from toolkit.events import read_steps
from toolkit.executors.slurm_sbatch import plan

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slurm

TINY = [
    "model=gpt_tiny",
    "data=synthetic",
    "trainer.steps=4",
    "trainer.log_every=1",
    "trainer.progress=false",
    "seed=7",
]


def with_repo(env: dict[str, str]) -> dict[str, str]:
    """This checkout's toolkit first on PYTHONPATH, whatever is installed in the venv."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env | {"PYTHONPATH": path}


def launch(
    cluster, *overrides: str, env: dict[str, str] | None = None, timeout_s=240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.launch", *overrides],
        cwd=REPO_ROOT,
        env=with_repo(env or cluster.env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_steps(run_dir / "metrics" / "rank0.jsonl")]


def errors(stderr: str) -> list[str]:
    """The error lines (warnings, e.g. about checkpoints being off, may precede them)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("warning:")]


def unique_name() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def queued(cluster, job_name: str) -> list[str]:
    return cluster.run("squeue", "-h", "-n", job_name, "-o", "%i").stdout.split()


def test_two_node_fsdp_run_matches_the_local_two_rank_run(slurm_cluster, tmp_path):
    # One intra-op thread per rank in both runs: the thread count changes float summation order.
    local = launch(
        slurm_cluster,
        *TINY,
        "cluster=local",
        "cluster.cpus_per_task=1",
        f"hydra.run.dir={tmp_path / 'local'}",
    )
    assert local.returncode == 0, local.stderr
    slurm = launch(
        slurm_cluster,
        *TINY,
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.tasks_per_node=1",
        "cluster.cpus_per_task=1",
        f"hydra.run.dir={tmp_path / 'slurm'}",
    )
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    # The launcher says where things are, then streams rank 0's output.
    assert "submitted Slurm job" in slurm.stdout
    assert f"run dir: {tmp_path / 'slurm'}" in slurm.stdout
    assert "world 2 (slurm)" in slurm.stderr
    assert "COMPLETED" in slurm.stdout
    # Same seed, same world size: the same per-step losses, bit for bit.
    assert len(losses(tmp_path / "slurm")) == 4
    assert losses(tmp_path / "slurm") == losses(tmp_path / "local")


def test_two_nodes_with_two_tasks_each_make_a_world_of_four(slurm_cluster, tmp_path):
    proc = launch(
        slurm_cluster,
        *TINY,
        "trainer.steps=2",
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.tasks_per_node=2",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world 4 (slurm)" in proc.stderr
    record = json.loads((tmp_path / "slurm.json").read_text())
    nodes = slurm_cluster.run("sacct", "-n", "-X", "-P", "-j", record["job_id"], "-o", "NodeList")
    assert nodes.stdout.strip() == "n[1-2]"
    assert sorted(p.name for p in (tmp_path / "logs").glob("rank*.log")) == [
        f"rank{k}.log" for k in range(4)
    ]


def test_a_sweep_becomes_one_job_array_and_reports_every_element(slurm_cluster, tmp_path):
    proc = launch(
        slurm_cluster,
        "-m",
        *TINY,
        "trainer.steps=2",
        "cluster=slurm",
        "trainer.micro_batch_size=2,4",
        "cluster.array_parallelism=2",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted Slurm job array" in proc.stdout
    ids = [json.loads((tmp_path / str(i) / "slurm.json").read_text())["job_id"] for i in (0, 1)]
    array_id = ids[0].split("_")[0]
    assert ids == [f"{array_id}_0", f"{array_id}_1"]
    assert f"[0] {ids[0]} ok" in proc.stdout and f"[1] {ids[1]} ok" in proc.stdout
    script = json.loads((tmp_path / "0" / "slurm.json").read_text())["sbatch_script"]
    assert "#SBATCH --array=0-1%2" in Path(script).read_text()
    # Each element ran its own config in its own run dir.
    for index, micro_batch in enumerate((2, 4)):
        steps = read_steps(tmp_path / str(index) / "metrics" / "rank0.jsonl")
        assert steps[0]["tokens"] == micro_batch * 128


def test_one_failing_rank_fails_the_whole_job_fast(slurm_cluster, tmp_path):
    started = time.monotonic()
    proc = launch(
        slurm_cluster,
        *TINY,
        "trainer.steps=100000",  # hours of work if the failure did not end the job
        "fault.fail_at_step=2",
        "fault.fail_rank=1",
        "cluster=slurm",
        "cluster.nodes=2",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode != 0
    assert time.monotonic() - started < 120
    assert "FAILED" in proc.stderr and "rank 1 failed" in proc.stderr
    # The tail of the failing rank's stderr, with its traceback.
    assert "injected failure at step 2" in proc.stderr


def test_detach_returns_after_submission_even_in_an_awkward_run_dir(slurm_cluster, tmp_path):
    run_dir = tmp_path / "runs with spaces" / 'it\'s "quoted" $HOME'
    hydra_dir = "'" + str(run_dir).replace("'", "\\'") + "'"
    proc = launch(
        slurm_cluster, *TINY, "cluster=slurm", "launch.detach=true", f"hydra.run.dir={hydra_dir}"
    )
    assert proc.returncode == 0, proc.stderr
    assert "submitted Slurm job" in proc.stdout
    record = json.loads((run_dir / "slurm.json").read_text())
    # What was submitted is exactly what launch.dry_run=true prints for this run.
    job = load_job(run_dir / "config.yaml")
    submitted = Path(record["sbatch_script"]).read_text()
    assert submitted == plan(job.cluster, [run_dir], REPO_ROOT).script()
    # Follow it to the end with the executor's own follower.
    follow = subprocess.run(
        [sys.executable, "-m", "toolkit.executors.slurm", str(run_dir)],
        cwd=REPO_ROOT,
        env=with_repo(slurm_cluster.env),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert follow.returncode == 0, follow.stderr
    assert len(losses(run_dir)) == 4


def test_plain_sbatch_of_jobs_train_sbatch_completes(slurm_cluster, tmp_path):
    env = with_repo(slurm_cluster.env) | {"TOOLKIT_PYTHON": sys.executable}
    proc = subprocess.run(
        ["sbatch", "--parsable", "--wait", "-N2", str(REPO_ROOT / "jobs" / "train.sbatch")]
        + TINY[:4],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    job_id = proc.stdout.strip()
    assert proc.returncode == 0, (tmp_path / f"slurm-{job_id}.out").read_text()
    run_dir = tmp_path / "outputs" / "slurm" / job_id
    assert len(losses(run_dir)) == 4
    assert "world 2 (slurm)" in (tmp_path / f"slurm-{job_id}.out").read_text()


def test_unknown_partition_is_rejected_by_sbatch_and_nothing_stays_queued(slurm_cluster, tmp_path):
    name = unique_name()
    proc = launch(
        slurm_cluster,
        *TINY,
        "cluster=slurm",
        "cluster.partition=nosuchpartition",
        f"cluster.job_name={name}",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode != 0
    assert "error: sbatch rejected the job" in proc.stderr
    assert "invalid partition" in proc.stderr.lower()
    assert queued(slurm_cluster, name) == []


def test_more_nodes_than_exist_is_rejected_and_nothing_stays_queued(slurm_cluster, tmp_path):
    name = unique_name()
    proc = launch(
        slurm_cluster,
        *TINY,
        "cluster=slurm",
        f"cluster.nodes={len(slurm_cluster.node_names) + 1}",
        f"cluster.job_name={name}",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode != 0
    assert "Node count specification invalid" in proc.stderr
    assert queued(slurm_cluster, name) == []


def test_no_sbatch_on_path_is_one_clear_line(slurm_cluster, tmp_path):
    env = slurm_cluster.env | {"PATH": str(tmp_path / "empty")}
    proc = launch(slurm_cluster, *TINY, "cluster=slurm", f"hydra.run.dir={tmp_path}", env=env)
    assert proc.returncode == 1
    assert errors(proc.stderr) == [
        "error: cluster=slurm: no `sbatch` on PATH; point SLURM_CONF at your cluster's "
        "slurm.conf (or run on a login node), or start the local dev cluster: "
        'scripts/dev-cluster up && eval "$(scripts/dev-cluster env)"'
    ]


def test_unreachable_slurmctld_is_one_clear_line(slurm_cluster, tmp_path):
    # A copy of the dev cluster's config whose controller port nobody listens on.
    conf = Path(slurm_cluster.env["SLURM_CONF"])
    dead = tmp_path / "etc"
    shutil.copytree(conf.parent, dead)
    text = (dead / "slurm.conf").read_text()
    port_line = next(line for line in text.splitlines() if line.startswith("SlurmctldPort="))
    (dead / "slurm.conf").write_text(text.replace(port_line, "SlurmctldPort=1"))
    env = slurm_cluster.env | {"SLURM_CONF": str(dead / "slurm.conf")}
    proc = launch(slurm_cluster, *TINY, "cluster=slurm", f"hydra.run.dir={tmp_path}", env=env)
    assert proc.returncode == 1
    [line] = errors(proc.stderr)
    assert line.startswith(f"error: cluster=slurm: slurmctld is not reachable (SLURM_CONF={dead}")
    assert "scripts/dev-cluster up" in line


def test_unknown_cluster_key_fails_before_submission_listing_valid_keys(slurm_cluster):
    proc = launch(slurm_cluster, *TINY, "cluster=slurm", "cluster.partiton=debug")
    assert proc.returncode == 2
    [line] = errors(proc.stderr)
    assert line.startswith("error: cluster.partiton: unknown key 'partiton' in cluster; valid")
    assert "partition" in line and "array_parallelism" in line
