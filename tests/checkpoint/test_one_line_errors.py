"""What a user can get wrong about paths is one line naming the path and what to do, with a
documented exit status: never a traceback, never a file of the run overwritten."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.checkpoint.conftest import REPO, env, launch
from toolkit.errors import EXIT_CHECKPOINT_UNUSABLE, EXIT_CONFIG

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_file_where_the_run_dir_should_be_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.write_text("not a directory")
    done = launch(run_dir)
    assert done.returncode == EXIT_CONFIG
    assert f"cannot write the run dir {run_dir}" in one_line(done.stderr)


def test_a_file_where_metrics_should_be_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics").write_text("in the way")
    done = launch(run_dir)
    assert done.returncode == EXIT_CONFIG
    line = one_line(done.stderr)
    assert f"{run_dir / 'metrics'}: File exists" in line and "remove any file in the way" in line


@pytest.mark.parametrize("sub", ["checkpoints", "nccl", "telemetry"])
def test_a_file_where_a_folder_of_the_ranks_should_be_is_one_line_before_launch(tmp_path, sub):
    """The ranks, the node agent or a tracker would each fail on it later, mid-run."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / sub).write_text("in the way")
    done = launch(run_dir)
    assert done.returncode == EXIT_CONFIG
    line = one_line(done.stderr)
    assert f"{run_dir / sub}: not a directory" in line and "remove any file in the way" in line
    assert not (run_dir / "logs" / "rank0.log").exists()  # no rank started


@pytest.mark.slow
def test_resume_from_a_file_is_one_line(tmp_path):
    done = launch(tmp_path / "run", "checkpoint.enabled=true", "checkpoint.resume_from=/etc/passwd")
    assert done.returncode == EXIT_CHECKPOINT_UNUSABLE
    line = one_line(done.stderr)
    assert "checkpoint.resume_from=/etc/passwd: not a directory" in line


def test_an_export_never_overwrites_a_file_of_the_run(checkpointed_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed_run, run_dir)
    before = (run_dir / "config.yaml").read_bytes()
    done = subprocess.run(
        [sys.executable, "scripts/export_model.py", str(run_dir), str(run_dir / "config.yaml")],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "an export never overwrites" in one_line(done.stderr)
    assert (run_dir / "config.yaml").read_bytes() == before
