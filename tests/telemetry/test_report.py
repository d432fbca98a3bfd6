"""`report` on synthetic 8-node data with planted faults, and on bad input."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.config.errors import ConfigError
from toolkit.config.telemetry import ReportConfig
from toolkit.telemetry.cli import main
from toolkit.telemetry.report.build import build_report
from toolkit.telemetry.synthetic import T0, Plan, generate

REPO = Path(__file__).resolve().parents[2]
PLAN = dict(
    nodes=8,
    gpus_per_node=4,
    duration_s=600.0,
    straggler_rank=13,
    idle_gap_at_s=250.0,
    idle_gap_s=60.0,
    checkpoint_every_s=200.0,
    restart_at_s=450.0,
)


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> tuple[Path, Plan]:
    run_dir = tmp_path_factory.mktemp("synthetic")
    plan = generate(run_dir, Plan(**PLAN))
    return run_dir, plan


@pytest.fixture(scope="module")
def report(synthetic_run):
    run_dir, _plan = synthetic_run
    return build_report(run_dir, None, ReportConfig(sacct=False))


def test_all_nodes_and_attempts_are_merged(report, synthetic_run):
    _run_dir, plan = synthetic_run
    assert len(plan.files) == 16  # 8 nodes x 2 attempts
    assert [n["node"] for n in report.nodes] == [f"gpu-node{i:03d}" for i in range(8)]
    assert all(n["attempts"] == [0, 1] for n in report.nodes)
    assert [r["rank"] for r in report.ranks] == list(range(32))
    assert all(r["gpu_util_pct"] > 50 for r in report.ranks)


def test_the_planted_straggler_is_found_with_its_score(report):
    ranks = [s for s in report.stragglers if s.kind == "rank"]
    assert [s.who for s in ranks] == ["rank 13 (gpu-node003)"]
    assert ranks[0].score == pytest.approx(0.15, abs=0.03)
    assert ranks[0].persistence > 0.9
    assert not [s for s in report.stragglers if s.kind == "node"]  # one slow GPU, not a node
    by_rank = {r["rank"]: r for r in report.ranks}
    assert by_rank[13]["throttle_s"] > 60  # its GPU throttled (thermal) a third of the time
    assert by_rank[12]["throttle_s"] == 0


def test_the_planted_idle_gap_is_found_and_the_restart_explained(report):
    unexplained = [g for g in report.idle_gaps if g.explanation.startswith("unexplained")]
    assert len(unexplained) == 1
    gap = unexplained[0]
    assert gap.start == pytest.approx(T0 + 250.0, abs=2.0)
    assert gap.duration_s == pytest.approx(60.0, abs=2.0)
    assert len(gap.ranks) == 32
    restarts = [g for g in report.idle_gaps if g.explanation.startswith("restart")]
    assert len(restarts) == 1 and "preemption" in restarts[0].explanation


def test_time_is_attributed_to_compute_data_checkpoint_and_idle(report):
    seconds = report.attribution.seconds
    assert seconds["compute"] > seconds["data_wait"] > 0
    assert seconds["checkpoint_stall"] == pytest.approx(2 * 4.0 * 32)  # stalls at 200 and 400 s
    assert seconds["idle_other"] >= 60.0 * 32
    assert seconds["restart_downtime"] == pytest.approx(60.0 * 32, rel=0.1)
    assert sum(report.attribution.shares().values()) == pytest.approx(1.0)


def test_plots_html_and_exports_are_written_and_parse(report):
    out = report.out_dir
    for name in (
        "step_time.png",
        "throughput.png",
        "gpu_heatmap.png",
        "training.png",
        "host.png",
        "gpu_curves.png",
    ):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / name).stat().st_size > 10_000
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 6 and "rank 13 (gpu-node003)" in html
    trace = json.loads((out / "trace.json").read_text())
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert {"M", "X", "C"} <= phases
    assert any(e["name"] == "preemption" for e in trace["traceEvents"])
    with open(out / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(r["steps"] for r in report.ranks)
    assert float(rows[0]["step_time_s"]) > 0
    with open(out / "events.csv") as f:
        events = list(csv.DictReader(f))
    assert {e["name"] for e in events} == {"checkpoint", "preemption", "restart"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stragglers"][0]["who"] == "rank 13 (gpu-node003)"


def test_cli_report_prints_the_summary(synthetic_run, tmp_path, capsys):
    run_dir, _plan = synthetic_run
    assert main(["report", str(run_dir), "--out", str(tmp_path), "--no-plots", "--no-export"]) == 0
    out = capsys.readouterr().out
    assert "Stragglers" in out and "rank 13 (gpu-node003)" in out and "unexplained" in out


def test_sacct_missing_is_skipped_with_a_note(synthetic_run, tmp_path):
    run_dir, _plan = synthetic_run
    env = dict(os.environ, PYTHONPATH=str(REPO), PATH=str(tmp_path))  # no sacct on PATH
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.telemetry",
            "report",
            str(run_dir),
            "--out",
            str(tmp_path / "r"),
            "--no-plots",
            "--no-export",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["sacct"] is None
    assert summary["sacct_note"] == "sacct not found on PATH: Slurm accounting skipped"


def test_a_corrupt_file_is_named_skipped_and_the_rest_reported(synthetic_run, tmp_path):
    run_dir, _plan = synthetic_run
    copy = tmp_path / "run"
    shutil.copytree(
        run_dir / "telemetry", copy / "telemetry", ignore=shutil.ignore_patterns("report")
    )
    broken = copy / "telemetry" / "node-gpu-node002-attempt1.h5"
    broken.write_bytes(broken.read_bytes()[:5000])  # truncated mid-file
    (copy / "telemetry" / "node-junk-attempt0.h5").write_bytes(b"not hdf5 at all")
    report = build_report(copy, None, ReportConfig(sacct=False, plots=False, export=False))
    skipped = {Path(p).name for p, _why in report.skipped}
    assert skipped == {"node-gpu-node002-attempt1.h5", "node-junk-attempt0.h5"}
    assert len(report.nodes) == 8  # node002 still reported from attempt 0
    assert [s.who for s in report.stragglers if s.kind == "rank"] == ["rank 13 (gpu-node003)"]


def test_a_run_without_telemetry_fails_with_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "no telemetry" in err[0]
    assert main(["report", str(tmp_path / "missing")]) == 1
    assert "no such run directory" in capsys.readouterr().err


def test_report_settings_are_validated():
    with pytest.raises(ConfigError, match="straggler_margin=-0.1: must be > 0"):
        ReportConfig(straggler_margin=-0.1)
