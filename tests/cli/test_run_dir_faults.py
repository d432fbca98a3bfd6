"""`toolkit status` and `toolkit runs` on run dirs that others damaged or left behind
(issue 46): valid JSON of the wrong type is one line naming the file, and every other run
is still listed; a run whose lock holder died is dead, not running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import REPO
from toolkit.cli.status import runs, status

pytestmark = [pytest.mark.slow, pytest.mark.load_tolerant]


def copy_of(run_dir: Path, where: Path) -> Path:
    return Path(shutil.copytree(run_dir, where))


def still_running(run_dir: Path) -> Path:
    """The run as it looked before it ended: no summary yet."""
    (run_dir / "summary.json").unlink()
    return run_dir


@pytest.mark.parametrize(
    ("file", "damage", "named"),
    [
        ("summary.json", {"final_loss": [1]}, "final_loss=[1]: not a number"),
        ("summary.json", {"steps": "4"}, 'steps="4": not a whole number'),
        ("summary.json", {"median_mfu": {"x": 1}}, 'median_mfu={"x": 1}: not a number'),
        ("metrics/rank0.jsonl", {"loss": "NaN"}, 'loss="NaN": not a number'),
    ],
)
def test_a_field_of_the_wrong_type_is_one_line_and_the_other_runs_are_listed(
    tokens_run, tmp_path, capsys, file, damage, named
):
    good = copy_of(tokens_run, tmp_path / "root" / "good")
    bad = copy_of(tokens_run, tmp_path / "root" / "bad")
    path = bad / file
    if file == "summary.json":
        path.write_text(json.dumps({**json.loads(path.read_text()), **damage}))
    else:  # a run still going whose last step record has a string for a number
        still_running(bad)
        last = json.loads(path.read_text().splitlines()[-1])
        with open(path, "a") as f:
            f.write(json.dumps({**last, "step": last["step"] + 1, **damage}) + "\n")

    assert status(str(bad), as_json=False) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: {path}: {named}; repair or remove that file"

    assert runs(str(tmp_path / "root"), as_json=False) == 0
    captured = capsys.readouterr()
    (warning,) = captured.err.strip().splitlines()
    assert warning == f"warning: skipped {bad}: {path}: {named}"
    listed = captured.out.splitlines()[1:]
    assert len(listed) == 1 and f" {good} " in listed[0]


def test_a_run_whose_lock_holder_died_is_dead_not_running(tokens_run, tmp_path, capsys):
    """The lock is the kernel's flock on RUN/.lock, taken here by a process of its own
    through the launcher's own code; SIGKILL frees it as a killed launcher's is freed."""
    run = still_running(copy_of(tokens_run, tmp_path / "run"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from toolkit.executors import rundir_lock\n"
            "rundir_lock.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)",
            str(run),
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert json.loads((run / ".lock").read_text())["pid"] == holder.pid
        assert status(str(run), as_json=True) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "running"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()

    assert status(str(run), as_json=False) == 0
    text = capsys.readouterr().out
    assert "state       dead (the process that held RUN/.lock ended without a summary" in text
    assert runs(str(run), as_json=True) == 0
    assert [r["state"] for r in json.loads(capsys.readouterr().out)] == ["dead"]
