"""`toolkit status` and `toolkit runs` on damaged run dirs: one line naming the file, and one
damaged run dir does not hide the others. status reads the metrics file from its end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.checkpoint.conftest import launch
from toolkit.cli.rundir import last_record
from toolkit.cli.status import runs, status


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    done = launch(run_dir, "trainer.steps=2", "telemetry=off")
    assert done.returncode == 0, done.stderr
    return run_dir


def copy_of(run_dir: Path, where: Path) -> Path:
    shutil.copytree(run_dir, where)
    return where


def test_a_summary_that_is_not_an_object_is_one_line(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path / "run")
    (run_dir / "summary.json").write_text("[1, 2]")
    assert status(str(run_dir), as_json=False) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{run_dir / 'summary.json'}: not a JSON object but a list" in line


def test_a_malformed_last_metrics_line_shows_the_step_before(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path / "run")
    (run_dir / "summary.json").unlink()  # as while the run is still going
    with open(run_dir / "metrics" / "rank0.jsonl", "a") as f:
        f.write('["not", "a", "step"]\n{"step": 3, "lo')
    assert status(str(run_dir), as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2


def test_runs_names_a_damaged_run_dir_and_lists_the_others(finished, tmp_path, capsys):
    good = copy_of(finished, tmp_path / "root" / "good")
    bad = copy_of(finished, tmp_path / "root" / "bad")
    (bad / "summary.json").write_text("{not json")
    assert runs(str(tmp_path / "root"), as_json=True) == 0
    captured = capsys.readouterr()
    assert [r["run_dir"] for r in json.loads(captured.out)] == [str(good)]
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"warning: skipped {bad}: {bad / 'summary.json'}: unreadable")


def test_the_last_record_is_read_from_the_end_across_blocks(tmp_path):
    path = tmp_path / "rank0.jsonl"
    lines = [json.dumps({"step": i, "loss": 1.0 / i, "pad": "x" * 50}) for i in range(1, 2000)]
    path.write_text("\n".join(lines) + "\n" + '{"step": 2000, "loss"')  # being written
    assert last_record(path, block_bytes=64)["step"] == 1999
    assert last_record(path)["step"] == 1999
    assert last_record(tmp_path / "absent.jsonl") is None
    (tmp_path / "junk.jsonl").write_bytes(b"\xff\xfe garbage\n[]\n")
    assert last_record(tmp_path / "junk.jsonl") is None
