"""`report` onto a full disk is one line naming the path, exit 1, not an OSError traceback."""

from __future__ import annotations

import subprocess

import pytest

from toolkit.telemetry.cli import main
from toolkit.telemetry.synthetic import Plan, generate


@pytest.fixture
def full_disk(tmp_path):
    """A real 16 KiB tmpfs (needs root, as the Slurm tests do)."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_report_onto_a_full_disk_is_one_line(tmp_path, full_disk, capsys):
    run_dir = tmp_path / "run"
    generate(run_dir, Plan(nodes=1, gpus_per_node=2, duration_s=120.0, straggler_rank=None))
    assert main(["report", str(run_dir), "--out", str(full_disk), "--no-plots"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {full_disk}") and "No space left on device" in line
