"""Your own series in the report: a callback's step metrics and session.log's other names
(metrics/rank0.jsonl, the last attempt's record of each step) and eval metrics besides the
loss each get a plot, under a file name of the report's own."""

from __future__ import annotations

import json

import pytest

from toolkit.config.telemetry import ReportConfig
from toolkit.events import JsonlSink, StepRecord
from toolkit.telemetry.report.build import build_report
from toolkit.telemetry.report.custom import custom_series
from toolkit.telemetry.synthetic import Plan, generate

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing


def record(step: int, ic: float) -> StepRecord:
    return StepRecord(
        step=step, wall_time=1.0 + step, step_time_s=0.1, data_wait_s=0.0,
        forward_backward_s=0.1, optimizer_s=0.0, loss=1.0, grad_norm=1.0, lr=1e-3, tokens=0,
        tokens_per_s=0.0, mfu=0.0, mem_peak_bytes=0,
        metrics={"ic": ic, "odd name/<b>": 2.0 * step},
    )  # fmt: skip


def test_each_series_of_yours_is_a_plot_of_the_last_attempt(tmp_path):
    run_dir = tmp_path / "run"
    generate(run_dir, Plan(nodes=1, gpus_per_node=1, duration_s=20.0))
    first = JsonlSink(run_dir / "metrics", 0)
    for step in (1, 2, 3):
        first.write_step(record(step, ic=-1.0))
    first.close()
    resumed = JsonlSink(run_dir / "metrics", 0)  # resumed from step 1
    for step in (2, 3, 4):
        resumed.write_step(record(step, ic=0.1 * step))
    resumed.close()
    evals = [{"name": "eval", "step": 4, "attrs": {"val_loss": 1.0, "max_grad_norm": 3.0}}]

    series = custom_series(run_dir, evals)
    assert series["ic"] == [(1, -1.0), (2, 0.2), (3, pytest.approx(0.3)), (4, 0.4)]
    assert series["eval/max_grad_norm"] == [(4, 3.0)]
    assert "loss" not in series and "eval/val_loss" not in series  # plotted elsewhere

    report = build_report(run_dir, None, ReportConfig(sacct=False, export=False))
    assert sorted(report.custom_series) == ["ic", "odd name/<b>"]
    files = {name: run_dir / "telemetry" / "report" / f"series_{i:02d}.png" for i, name in
             enumerate(sorted(report.custom_series))}  # fmt: skip
    for name, path in files.items():
        assert report.custom_series[name] == str(path) and path.stat().st_size > 0
    html = (run_dir / "telemetry" / "report" / "report.html").read_text()
    assert "Your series" in html and "odd name/&lt;b&gt;" in html
    saved = json.loads((run_dir / "telemetry" / "report" / "summary.json").read_text())
    assert sorted(saved["custom_series"]) == ["ic", "odd name/<b>"]
