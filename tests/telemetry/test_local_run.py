"""A real 2-rank local run writes the node file the docs describe, readable mid-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from toolkit.config.telemetry import TelemetryConfig
from toolkit.distributed.env import DistEnv
from toolkit.telemetry.cli import main
from toolkit.telemetry.read import load_node, node_files
from toolkit.telemetry.schema import EVENT_COLUMNS, step_columns
from toolkit.telemetry.sink import build_telemetry_sinks

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

REPO = Path(__file__).resolve().parents[2]
STEPS = 40


def launch(run_dir: Path, *overrides: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolkit.launch",
            "model=gpt_tiny",
            f"trainer.steps={STEPS}",
            "trainer.progress=false",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow  # ~15 s alone; a real 2-rank launch, slower on a loaded machine
@pytest.mark.timeout(300)
def test_local_run_writes_the_documented_node_file(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, "telemetry.interval_s=0.1", "telemetry.flush_interval_s=0.3")
    # While the job runs, this process (not the writer) reads the file being written.
    rows_mid_run = 0
    while proc.poll() is None:
        files = node_files(run_dir)
        if files:
            try:
                node = load_node(files[0])
                rows_mid_run = max(rows_mid_run, len(node.steps[0]))
                node.close()
            except (OSError, KeyError):
                pass
        if 0 < rows_mid_run < STEPS:
            break
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert rows_mid_run > 0, "the file was never readable while the job ran"

    (path,) = node_files(run_dir)
    assert path.name.startswith("node-") and path.name.endswith("-attempt0.h5")
    node = load_node(path)
    try:
        assert node.ranks == [0, 1] and node.attempt == 0
        assert node.attrs["torch_version"].startswith("2.")
        assert "gpt_tiny" in node.attrs["config_yaml"] or "num_layers" in node.attrs["config_yaml"]
        assert node.attrs["gpu_absent_reason"] and node.attrs["ib_absent_reason"]
        assert not node.gpus and not node.ib  # absent here, and the attributes say why
        for rank in (0, 1):
            steps = node.steps[rank]
            assert sorted(steps.names) == sorted(c.name for c in step_columns())
            for column in step_columns():
                assert steps[column.name].dtype == np.dtype(column.dtype), column.name
                assert len(steps[column.name]) == STEPS
            assert list(steps["step"]) == list(range(1, STEPS + 1))
            assert np.all(np.diff(steps["wall_time"]) > 0)
        events = node.file["events"]
        assert sorted(events) == sorted(c.name for c in EVENT_COLUMNS)
        assert {e["name"] for e in node.events} == {"eval"}
        assert len(node.host) >= 2 and node.host.units("cpu_pct").startswith("%")
    finally:
        node.close()

    assert main(["report", str(run_dir), "--no-plots", "--no-sacct"]) == 0
    summary = json.loads((run_dir / "telemetry" / "report" / "summary.json").read_text())
    assert [r["steps"] for r in summary["ranks"]] == [STEPS, STEPS]


def test_telemetry_off_builds_no_sink(tmp_path):
    env = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 29500)
    assert build_telemetry_sinks(TelemetryConfig(enabled=False), env, tmp_path) == []
    assert not (tmp_path / "telemetry").exists()
