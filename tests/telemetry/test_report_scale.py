"""Reports of long runs: per-node summaries cached beside the node files, the streamed
report against the full read on the same synthetic run (planted straggler, idle gap,
checkpoints, a restart), the cache's key and mode, and `watch` reusing open files."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest

from toolkit.config.telemetry import ReportConfig
from toolkit.telemetry.h5store import NodeFileWriter
from toolkit.telemetry.read import node_files
from toolkit.telemetry.report import summary
from toolkit.telemetry.report.build import build_report
from toolkit.telemetry.schema import TIME, Column, TableSpec, steps_spec
from toolkit.telemetry.synthetic import T0, Plan, generate
from toolkit.telemetry.watch import _reopen, snapshot

PLAN = dict(
    nodes=4,
    gpus_per_node=4,
    duration_s=900.0,
    straggler_rank=6,
    idle_gap_at_s=250.0,
    idle_gap_s=60.0,
    checkpoint_every_s=200.0,
    restart_at_s=600.0,
)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("scale")
    generate(run_dir, Plan(**PLAN), jobs=2)  # the process-pool path of the generator too
    full = build_report(run_dir, run_dir / "full", ReportConfig(sacct=False, stream="off"))
    streamed = build_report(run_dir, run_dir / "streamed", ReportConfig(sacct=False, stream="on"))
    return run_dir, full, streamed


def test_the_streamed_report_finds_what_the_full_read_finds(reports):
    _run_dir, full, streamed = reports
    assert full.scale is None and streamed.scale["summaries_computed"] == 8  # 4 nodes x 2
    # Sums (the time attribution) and per-GPU statistics are exact.
    for key, value in full.attribution.seconds.items():
        assert streamed.attribution.seconds[key] == pytest.approx(value, rel=1e-9, abs=1e-6)
    assert [(g.node, g.index) for g in streamed.gpus] == [(g.node, g.index) for g in full.gpus]
    for a, b in zip(streamed.gpus, full.gpus, strict=True):
        for name in ("mean_util_pct", "mean_power_w", "throttle_s", "max_temp_c", "energy_j"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9), name
    # The same idle gaps (the unexplained one and the restart), with the same ranks.
    assert [(g.explanation, g.ranks) for g in streamed.idle_gaps] == [
        (g.explanation, g.ranks) for g in full.idle_gaps
    ]
    for a, b in zip(streamed.idle_gaps, full.idle_gaps, strict=True):
        assert (a.start, a.end) == pytest.approx((b.start, b.end))
    # The planted straggler, found chunk by chunk, with about the same score.
    assert [s.who for s in streamed.stragglers] == [s.who for s in full.stragglers]
    assert [s.who for s in full.stragglers] == ["rank 6 (gpu-node001)"]
    assert streamed.stragglers[0].score == pytest.approx(full.stragglers[0].score, abs=0.01)
    # Per-rank rows: step counts exact; medians exact within an attempt, and close over two.
    for a, b in zip(streamed.ranks, full.ranks, strict=True):
        assert (a["rank"], a["node"], a["steps"], a["attempts"]) == (
            b["rank"],
            b["node"],
            b["steps"],
            b["attempts"],
        )
        assert a["median_step_s"] == pytest.approx(b["median_step_s"], rel=0.02)
        assert a["p99_step_s"] == pytest.approx(b["p99_step_s"], rel=0.02)
        assert a["data_wait_share"] == pytest.approx(b["data_wait_share"], rel=1e-6)
    assert streamed.verdict.dominant == full.verdict.dominant
    for term, value in full.verdict.terms.items():
        assert streamed.verdict.terms[term] == pytest.approx(value, rel=0.02), term
    # Every plot and the HTML are written; the steps export is per chunk, no step trace.
    for key in ("step_time_png", "throughput_png", "gpu_heatmap_png", "training_png", "html"):
        assert Path(streamed.outputs[key]).stat().st_size > 1000, key
    assert "step_chunks_csv" in streamed.outputs and "trace" not in streamed.outputs
    saved = json.loads(Path(streamed.outputs["json"]).read_text())
    assert saved["scale"]["chunk_steps"] == streamed.scale["chunk_steps"] >= 1


def test_summaries_are_private_cached_and_recomputed_when_the_file_or_settings_change(reports):
    run_dir, _full, _streamed = reports
    files = node_files(run_dir)
    cached = [summary.cache_path(p) for p in files]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in cached)
    cfg = ReportConfig(sacct=False, stream="on", plots=False, export=False)
    again = build_report(run_dir, run_dir / "again", cfg)
    assert again.scale == {"chunk_steps": again.scale["chunk_steps"], "summaries_cached": 8,
                           "summaries_computed": 0}  # fmt: skip
    st = files[0].stat()
    os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # "rewritten"
    cached[1].write_text("{not json")  # a damaged cache is recomputed, not trusted
    third = build_report(run_dir, run_dir / "third", cfg)
    assert third.scale["summaries_computed"] == 2
    other = build_report(
        run_dir, run_dir / "other", ReportConfig(**{**cfg.__dict__, "skip_first_steps": 3})
    )
    assert other.scale["summaries_computed"] == 8  # the settings are part of the key


def test_summary_arrays_hold_numbers_only():
    a = np.arange(5, dtype=np.float32)
    assert np.array_equal(summary.unpack(summary.pack(a)), a)
    with pytest.raises(ValueError, match="dtype"):
        summary.unpack({"dtype": "|O", "b64": ""})


def test_watch_keeps_files_open_and_sees_new_rows_of_a_file_being_written(tmp_path):
    path = tmp_path / "telemetry" / "node-n0-attempt0.h5"
    gpu = TableSpec("gpu/0", [TIME, Column("utilization_gpu_pct", "f4", "%")])
    writer = NodeFileWriter(path, [gpu, steps_spec(0)], {"node": "n0", "ranks": [0]})
    try:

        def steps(first: int, n: int) -> dict:
            s = np.arange(first, first + n)
            return {"step": s, "wall_time": T0 + s, "step_time_s": np.full(n, 0.5),
                    "data_wait_s": np.zeros(n), "tokens_per_s": np.ones(n), "mfu": np.ones(n),
                    "loss": np.ones(n)}  # fmt: skip

        writer.extend("steps/rank0", steps(1, 5))
        writer.extend("gpu/0", {"time": T0 + np.arange(5.0), "utilization_gpu_pct": np.ones(5)})
        writer.flush()
        run = _reopen(tmp_path, None)
        assert len(run.nodes[0].steps[0]) == 5
        writer.extend("steps/rank0", steps(6, 7))
        writer.flush()
        again = _reopen(tmp_path, run)
        assert again is run and len(run.nodes[0].steps[0]) == 12  # refreshed, not reopened
        from rich.console import Console

        console = Console(width=160, record=True)
        console.print(snapshot(tmp_path, run))
        assert re.search(r"│ n0\s+│\s+0 │\s+12 │", console.export_text())  # rank 0 at step 12
        run.close()
    finally:
        writer.close()
