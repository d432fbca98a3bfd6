"""Every `toolkit` subcommand maps onto its module: cheap forms (--help, dry runs)."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import toolkit


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], "commands:"),
        (["launch", "--help"], "Config groups"),
        (["report", "--help"], "report"),
        (["watch", "--help"], "--once"),
        (["bench", "--help"], "ab "),
        (["bench", "train", "--help"], "usage:"),
        (["perfmodel", "--help"], "--world"),
        (["export", "--help"], "--format"),
        (["cluster", "--help"], "up|down|status"),
        (["status", "--help"], "run directory"),
        (["runs", "--help"], "--json"),
    ],
)
def test_each_subcommand_answers_help(tmp_path, args, expected):
    done = toolkit(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_launch_dry_run_on_slurm_prints_the_script(tmp_path):
    done = toolkit(
        tmp_path, "launch", "cluster=slurm", "checkpoint=periodic", "launch.dry_run=true"
    )
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --requeue" in done.stdout


def test_perfmodel_predicts(tmp_path):
    done = toolkit(tmp_path, "perfmodel", "--json", "model=gpt_tiny")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


def test_unknown_commands_and_benches_exit_2(tmp_path):
    assert toolkit(tmp_path, "nope").returncode == 2
    bad = toolkit(tmp_path, "bench", "nope")
    assert bad.returncode == 2 and "no benchmark 'nope'" in bad.stderr


def test_runs_on_an_empty_dir_and_a_missing_one(tmp_path):
    assert "no run directories" in toolkit(tmp_path, "runs", str(tmp_path)).stdout
    assert toolkit(tmp_path, "runs", str(tmp_path / "missing")).returncode == 2


def test_cluster_status_runs_the_dev_cluster_script(tmp_path):
    done = toolkit(tmp_path, "cluster", "status")
    assert done.returncode in (0, 1)  # 1: not up; either way the script answered
    assert done.stdout or done.stderr
