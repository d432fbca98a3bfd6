"""`toolkit perfmodel` and `toolkit plan` in the small-model regime: the launch floor, packing,
data paths and advice printed, `--bench-data FILE` read as plain JSON."""

from __future__ import annotations

import json
import math

import pytest

from toolkit.config.compose import job_or_none
from toolkit.perfmodel.__main__ import main as perfmodel_main
from toolkit.perfmodel.job import predict_job
from toolkit.perfmodel.regime import read_bench_data
from toolkit.plan import main as plan_main

SMALL_GPU = ["model=ts_transformer", "data=returns", "hardware=h100", "precision=bf16"]


def test_perfmodel_prints_the_regime_and_reads_bench_data(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"results": [{"format": "npy", "samples_per_s": 12_500.0}]}))
    assert perfmodel_main(["--json", "--bench-data", str(bench), *SMALL_GPU]) == 0
    regime_json = json.loads(capsys.readouterr().out)["regime"]
    assert regime_json["bound"] == "overhead"
    assert regime_json["data_rates_samples_per_s"]["loader"] == 12_500.0
    assert math.isclose(
        regime_json["floor_s"] + regime_json["member_s"],
        predict_job(job_or_none(SMALL_GPU, [])).step_s,
    )


def test_a_bench_data_file_that_is_not_one_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="no samples_per_s rows"):
        read_bench_data(bad)
    assert perfmodel_main(["--bench-data", str(tmp_path / "missing.json"), *SMALL_GPU]) == 2


def test_plan_advises_on_the_best_layout_an_ensemble_can_run(capsys):
    assert plan_main(["--top", "1", *SMALL_GPU]) == 0
    out = capsys.readouterr().out
    assert "launch floor: " in out
    assert "overhead-bound: the launch floor" in out
