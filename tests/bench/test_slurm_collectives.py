"""Two-node benchmark runs on the dev Slurm cluster (scripts/dev-cluster, branch slurm).

Both paths a user has: the launcher (`cluster=slurm`) and the sbatch wrapper. Each node
detects its own fabric and records it; the table covers 2 ranks on 2 nodes.
"""

import json
import subprocess
import sys

import pytest

from tests.nccl.cli import REPO, run_module
from toolkit.collectives.report import read_h5

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.usefixtures("clean_nccl_environment"),
]
SMALL = ["collectives.max_bytes=65536", "collectives.iters=3", "collectives.warmup_iters=1"]


def assert_two_node_run(run_dir):
    rows, attrs = read_h5(run_dir / "collectives.h5")
    assert attrs["world_size"] == 2 and attrs["num_nodes"] == 2
    assert rows and all(r.wrong == 0 for r in rows)
    for node in (0, 1):
        record = json.loads((run_dir / f"nccl-env-node{node}.json").read_text())
        assert record["fabric"] in ("infiniband", "roce", "ethernet")  # detected per node


def test_launcher_runs_the_benchmark_on_two_nodes(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_module(
        "toolkit.launch",
        "task=bench_collectives",
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.tasks_per_node=1",
        f"cluster.partition={slurm_cluster.partition}",
        *SMALL,
        f"hydra.run.dir={run_dir}",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_two_node_run(run_dir)


def test_sbatch_wrapper_runs_the_benchmark_on_two_nodes(slurm_cluster, tmp_path):
    run_dir = tmp_path / "wrapped"
    env = {**slurm_cluster.env, "TOOLKIT_PYTHON": sys.executable}
    proc = subprocess.run(
        [
            "sbatch",
            "--wait",
            "--nodes=2",
            "--ntasks-per-node=1",
            f"--partition={slurm_cluster.partition}",
            f"--output={tmp_path}/slurm-%j.out",
            str(REPO / "jobs" / "collectives.sbatch"),
            *SMALL,
            f"hydra.run.dir={run_dir}",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr + "".join(
        p.read_text() for p in tmp_path.glob("slurm-*.out")
    )
    assert_two_node_run(run_dir)


def test_a_settings_sweep_is_one_array_and_gets_ranked(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_module(
        "toolkit.launch",
        "-m",
        "task=bench_collectives",
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.tasks_per_node=1",
        f"cluster.partition={slurm_cluster.partition}",
        "nccl=auto,ethernet",
        "collectives.ops=[all_reduce]",
        *SMALL,
        f"hydra.sweep.dir={sweep}",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_ids = {json.loads((sweep / i / "slurm.json").read_text())["job_id"] for i in ("0", "1")}
    assert len({job_id.split("_")[0] for job_id in job_ids}) == 1  # one array, two elements
    out = run_module("toolkit.bench.compare_collectives", str(sweep))
    assert out.returncode == 0, out.stderr
    ranking = json.loads((sweep / "compare_collectives.json").read_text())["ranking"]
    assert {r["label"] for r in ranking} == {"nccl=auto", "nccl=ethernet"}
