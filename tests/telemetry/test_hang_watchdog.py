"""The hang watchdog, end to end on the local executor (2 ranks, gloo, the tiny model): a rank
that stops makes the node agent dump every rank's stacks, name the stuck rank and the
collective the others wait in, and end the job with exit status 79 and one line; a run that
is slow but progressing is left alone."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from tests.conftest import launch, losses
from toolkit.cli.rundir import read_run
from toolkit.config.telemetry import ReportConfig
from toolkit.errors import EXIT_HANG
from toolkit.fault.hang import read_hang_summary
from toolkit.telemetry.report.build import build_report

FAST = ["fault.hang_timeout_s=5", "fault.hang_startup_timeout_s=60"]


def only_hang(run_dir: Path) -> Path:
    dirs = [p for p in (run_dir / "hangs").iterdir() if not p.name.startswith(".")]
    assert len(dirs) == 1, dirs
    return dirs[0]


def run_hang(tiny: list[str], run_dir: Path, where: str, rank: int) -> tuple[object, float]:
    started = time.time()
    result = launch(
        *tiny,
        "trainer.steps=500",
        "fault.hang_at_step=3",
        f"fault.hang_rank={rank}",
        f"fault.hang_where={where}",
        *FAST,
        f"hydra.run.dir={run_dir}",
        timeout=180,
    )
    return result, time.time() - started


@pytest.mark.slow
@pytest.mark.waits
def test_a_rank_blocking_before_a_collective_is_named_dumped_and_the_job_ends_79(
    tmp_path, tiny
) -> None:
    result, elapsed = run_hang(tiny, tmp_path, "collective", rank=1)
    assert result.returncode == EXIT_HANG, result.stderr[-3000:]
    hang = only_hang(tmp_path)
    summary = read_hang_summary(hang)
    # The one line, last on stderr, names the rank, the node, the collective and the dumps.
    line = result.stderr.strip().splitlines()[-1]
    assert line == summary["message"]
    assert line.startswith("hang: rank 1 on node ") and f"dumps in {hang}" in line
    assert summary["stuck_ranks"] == [1]
    assert summary["waiting_ranks"] == [0]
    assert summary["collective"]["op"] == "all_reduce"  # the step's loss/vote all-reduce
    assert f"stuck in all_reduce #{summary['collective']['seq']} for " in line
    assert summary["step"] == 3
    assert 5.0 <= summary["stuck_for_s"] < 30.0
    assert summary["stuck_hosts"] == [summary["hosts_by_rank"]["1"]]
    # Every rank's stacks, all threads, with the training loop's frames.
    for rank in (0, 1):
        text = (hang / f"stacks-rank{rank}.txt").read_text()
        assert "in fit" in text and "in train_step" in text and "Thread 0x" in text
    assert "in hang_forever" in (hang / "stacks-rank1.txt").read_text()
    assert "in all_reduce" in (hang / "stacks-rank0.txt").read_text()
    for path in hang.iterdir():  # the job's files are its user's only
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # Bounded: the timeout, the dumps, the kill: well under a minute after the hang.
    assert elapsed < 90, elapsed
    assert len(losses(tmp_path)) == 3  # the steps before the hang were recorded
    # The telemetry report leads its diagnosis with the hang (the agent's "hang" event).
    report = build_report(tmp_path, None, ReportConfig(sacct=False, plots=False, export=False))
    hangs = [f for f in report.verdict.findings if f.kind == "hang"]
    assert [f.what for f in hangs] == [line]
    assert report.verdict.findings[0].kind == "hang"


@pytest.mark.slow
@pytest.mark.waits
def test_a_rank_hanging_outside_collectives_is_named(tmp_path, tiny) -> None:
    result, _ = run_hang(tiny, tmp_path, "outside", rank=0)
    assert result.returncode == EXIT_HANG, result.stderr[-3000:]
    hang = only_hang(tmp_path)
    summary = read_hang_summary(hang)
    assert summary["stuck_ranks"] == [0]
    assert summary["waiting_ranks"] == [1]  # rank 1 went on into the next step's collective
    text = (hang / "stacks-rank0.txt").read_text()
    assert "in hang_forever" in text and "in fit" in text and "in train_step" not in text
    run = read_run(tmp_path, ask_slurm=False)  # what `toolkit status` and `runs` show
    assert (run.state, run.stop_reason, run.exit_code) == ("hung", summary["message"], 79)


@pytest.mark.slow
@pytest.mark.waits
def test_a_slow_but_progressing_run_is_not_declared_hung(tmp_path, tiny) -> None:
    """Data 3 s late every step (under the 5 s timeout), and a checkpoint save that stalls
    8 s (longer than the timeout: saves get the startup limit): a slow run, not a hang."""
    result = launch(
        *tiny,
        "trainer.steps=4",  # the stalled save at step 2 is waited for at step 4
        "fault.data_delay_s=3",
        "checkpoint.enabled=true",
        "checkpoint.interval_steps=2",
        "fault.save_stall_step=2",
        "fault.save_stall_s=8",
        *FAST,
        f"hydra.run.dir={tmp_path}",
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(losses(tmp_path)) == 4
    assert not [p for p in (tmp_path / "hangs").iterdir() if not p.name.startswith(".")]
    assert not list((tmp_path / "hangs" / ".stacks").iterdir())  # clean exit: nothing left
    agent_log = "".join(p.read_text() for p in (tmp_path / "logs").glob("telemetry-*.log"))
    assert "hang" not in agent_log


@pytest.mark.slow
@pytest.mark.waits
def test_a_first_step_slower_than_the_timeout_gets_the_startup_limit(tmp_path, tiny) -> None:
    """8 s of data wait in the only step, against a 5 s step limit: start-up, not a hang
    (with fault.hang_startup_timeout_s=6 the same run is declared hung)."""
    result = launch(
        *tiny,
        "trainer.steps=1",
        "fault.data_delay_s=8",
        *FAST,
        f"hydra.run.dir={tmp_path}",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [p for p in (tmp_path / "hangs").iterdir() if not p.name.startswith(".")]


@pytest.mark.slow
@pytest.mark.waits
def test_the_watchdog_off_leaves_a_hang_alone_until_killed(tmp_path, tiny) -> None:
    """fault.hang_watchdog=false: nothing is declared (the launcher's own limit ends it)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolkit.launch",
            *tiny,
            "trainer.steps=500",
            "fault.hang_at_step=2",
            "fault.hang_rank=1",
            "fault.hang_watchdog=false",
            *FAST,
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(_lines(tmp_path)) < 2:
            time.sleep(0.5)
        time.sleep(12)  # more than twice the timeout after the hang
        assert proc.poll() is None
        assert not (tmp_path / "hangs").exists() or not [
            p for p in (tmp_path / "hangs").iterdir() if not p.name.startswith(".")
        ]
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def _lines(run_dir: Path) -> list[str]:
    try:
        return (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
    except OSError:
        return []


def test_the_summary_is_json_with_the_shared_fields(tmp_path) -> None:
    from toolkit.fault.hang import new_hang_dir, write_hang_summary

    directory = new_hang_dir(tmp_path)
    summary = {
        "stuck_ranks": [5],
        "stuck_hosts": ["n2"],
        "waiting_ranks": [0, 1],
        "collective": {"op": "all_gather", "seq": 8812},
        "stuck_for_s": 612.0,
        "step": 20,
        "message": "hang: ...",
        "hosts_by_rank": {"5": "n2"},
    }
    path = write_hang_summary(directory, summary)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == summary
    assert read_hang_summary(path) == read_hang_summary(directory) == summary
    path.write_text(json.dumps({"stuck_ranks": []}))
    with pytest.raises(ValueError, match="missing"):
        read_hang_summary(path)


@pytest.mark.slow
@pytest.mark.waits
def test_the_injected_hang_fires_in_the_first_attempt_only(tmp_path, tiny) -> None:
    """A requeued job (Slurm restart count 1) resumes past the injected hang."""
    result = launch(
        *tiny,
        "trainer.steps=5",
        "fault.hang_at_step=2",
        "fault.hang_rank=1",
        *FAST,
        f"hydra.run.dir={tmp_path}",
        env={"SLURM_RESTART_COUNT": "1"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(losses(tmp_path)) == 5
