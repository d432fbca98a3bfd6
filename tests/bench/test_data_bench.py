"""The loader benchmark measures every (format, workers) pair and sets them against the
step rate the performance model predicts for the job."""

from __future__ import annotations

import json

from toolkit.bench.data import main


def test_the_loader_benchmark_reports_rates_and_whether_they_keep_up(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["--workers", "0", "2", "--formats", "npy", "parquet", "--times", "600"]
    argv += ["--instruments", "4", "--steps", "3", "--warmup", "1", "--dir", str(tmp_path)]
    assert main([*argv, "--json", str(out), "data.seq_len=16"]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert [(r["format"], r["workers"]) for r in result["results"]] == [
        ("npy", 0),
        ("npy", 2),
        ("parquet", 0),
        ("parquet", 2),
    ]
    need = result["needed_samples_per_s_per_rank"]
    assert need > 0 and result["predicted_step_s"] > 0
    for row in result["results"]:
        assert row["samples_per_s"] > 0 and row["mb_per_s"] > 0
        assert row["keeps_up"] == (row["samples_per_s"] >= need)


def test_the_paths_comparison_interleaves_host_device_and_the_gather_bound(tmp_path) -> None:
    out = tmp_path / "paths.json"
    argv = ["--paths", "--repeats", "2", "--min-s", "0", "--workers", "0", "--formats", "npy"]
    argv += ["--times", "600"]
    argv += ["--instruments", "4", "--steps", "3", "--warmup", "1", "--dir", str(tmp_path)]
    assert main([*argv, "--json", str(out), "data.seq_len=16"]) == 0
    paths = json.loads(out.read_text())["paths"]
    assert paths["placement"].startswith("data: device-resident, ")
    for name in ("host_loader", "device_resident", "gather_bound"):
        assert len(paths["samples_per_s"][name]) == 2 and paths["median_samples_per_s"][name] > 0
    median = paths["median_samples_per_s"]
    assert paths["device_over_host"] == median["device_resident"] / median["host_loader"]
