"""`launch.dry_run=true` prints the exact sbatch script and submits nothing (no cluster needed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from toolkit import launch
from toolkit.executors import repo_root

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def hydra_quote(path: Path) -> str:
    """A path as a Hydra override value: single-quoted, with \\ and ' escaped."""
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME; UPDATE_GOLDEN=1 rewrites it instead (review the diff)."""
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()


def normalise(text: str, tmp_path: Path) -> str:
    return (
        text.replace(sys.executable, "{python}")
        .replace(str(repo_root()), "{repo}")
        .replace(str(tmp_path), "{tmp}")
    )


@pytest.fixture
def awkward_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs with spaces" / 'it\'s "quoted" $HOME'


def dry_run(capsys, *overrides: str, multirun: bool = False) -> str:
    flags = ["-m"] if multirun else []
    argv = [*flags, "cluster=slurm", "launch.dry_run=true", "model=gpt_tiny", *overrides]
    assert launch.main(argv) == 0
    return capsys.readouterr().out


def test_dry_run_prints_the_sbatch_script_with_awkward_paths_quoted(capsys, tmp_path, awkward_dir):
    out = dry_run(
        capsys,
        "cluster.nodes=2",
        "cluster.tasks_per_node=2",
        "cluster.partition=debug",
        "cluster.account=ml",
        "cluster.mem=8G",
        "cluster.time=00:30:00",
        "cluster.exclusive=true",
        "cluster.signal_lead_s=90",
        "cluster.sbatch_extra=['--reservation=demo','--mail-type=END']",
        "cluster.setup=['module load cuda','echo \"ready\"']",
        f"hydra.run.dir={hydra_quote(awkward_dir)}",
    )
    check_golden("slurm_dry_run.sbatch", normalise(out, tmp_path))
    assert not awkward_dir.exists()  # nothing written, nothing submitted


def test_dry_run_of_a_sweep_prints_one_array_script(capsys, tmp_path):
    out = dry_run(
        capsys,
        "trainer.micro_batch_size=2,4,8",
        "cluster.array_parallelism=2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        multirun=True,
    )
    check_golden("slurm_dry_run_array.sbatch", normalise(out, tmp_path))
    assert not (tmp_path / "sweep").exists()
