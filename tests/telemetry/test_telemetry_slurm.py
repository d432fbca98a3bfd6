"""Telemetry on the 2-node dev cluster: one node file per Slurm node, joined with sacct."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.telemetry.read import load_node, node_files

REPO = Path(__file__).resolve().parents[2]
STEPS = 12

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_two_node_job_writes_one_file_per_node_and_the_report_joins_sacct(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.launch",
            "cluster=slurm",
            "cluster.nodes=2",
            "model=gpt_tiny",
            "data=synthetic",
            f"trainer.steps={STEPS}",
            "trainer.progress=false",
            "telemetry.interval_s=0.2",
            "telemetry.flush_interval_s=0.5",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = node_files(run_dir)
    job_nodes = slurm_cluster.node_names[:2]  # an idle cluster gives a 2-node job its first two
    assert [p.name for p in files] == [f"node-{n}-attempt0.h5" for n in job_nodes]
    ranks = []
    for path in files:
        node = load_node(path)
        try:
            assert node.job_id.isdigit() and node.attrs["num_nodes"] == 2
            ranks += node.ranks
            for rank in node.ranks:
                assert len(node.steps[rank]) == STEPS
        finally:
            node.close()
    assert sorted(ranks) == [0, 1]
    report = subprocess.run(
        [sys.executable, "-m", "toolkit.telemetry", "report", str(run_dir), "--no-plots"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    summary = json.loads((run_dir / "telemetry" / "report" / "summary.json").read_text())
    assert [n["node"] for n in summary["nodes"]] == job_nodes
    assert summary["sacct"] is not None, summary["sacct_note"]
    assert any(j["state"] == "COMPLETED" for j in summary["sacct"]["jobs"])
    assert os.path.exists(summary["outputs"]["trace"])
