"""The checkpoint benchmarks run end to end on tiny inputs and report what they measured."""

import json
from itertools import pairwise

import pytest

from toolkit.bench.checkpoint.__main__ import main as checkpoint_bench
from toolkit.bench.checkpoint.baselines import Neighbour
from toolkit.bench.checkpoint.stall import summarize_stall


@pytest.mark.slow
def test_stall_runs_every_mode_and_summarizes_lost_time(tmp_path):
    out = tmp_path / "stall.json"
    argv = ["stall", "--model", "gpt_tiny", "--ranks", "1", "--trials", "1", "--steps", "2"]
    assert checkpoint_bench([*argv, "--dir", str(tmp_path), "--json", str(out)]) == 0

    result = json.loads(out.read_text())
    windows = result["raw"]["window_s"]
    assert set(windows) == {
        "none",
        "raw-bg",
        "async-idle-overlap-direct",
        "async-idle-overlap-buffered",
        "sync",
    }
    # Every measured window sits between two without a checkpoint, its reference their mean.
    assert len(windows["none"]) == len(windows)
    references = result["raw"]["reference"]
    assert set(references) == set(windows) - {"none"}
    means = {(a + b) / 2 for a, b in pairwise(windows["none"])}
    assert all(len(v) == 1 and v[0]["window_s"] in means for v in references.values())
    saves = result["raw"]["async_saves"]["async-idle-overlap-direct"]
    assert saves[0]["error"] is None and saves[0]["direct_io"] is True
    assert result["raw"]["async_saves"]["async-idle-overlap-buffered"][0]["direct_io"] is False
    summary = summarize_stall(result["raw"])
    assert summary["async-idle-overlap-direct"]["blocked_s"] >= 0
    assert summary["checkpoint_GB"] > 0


def test_the_neighbour_uses_the_cpu_seconds_it_is_asked_for():
    neighbour = Neighbour("idle", buffer_bytes=8 << 20)
    try:
        neighbour.start(0.3)
        used = neighbour.wait()
    finally:
        neighbour.close()
    assert 0.3 <= used < 1.0
    assert neighbour.process.exitcode == 0


@pytest.mark.slow
def test_stall_with_a_neighbour_window_reports_the_cost_per_cpu_second(tmp_path):
    out = tmp_path / "stall.json"
    argv = ["stall", "--model", "gpt_tiny", "--ranks", "1", "--trials", "1", "--steps", "2"]
    argv += ["--variants", "idle:overlap:direct", "--neighbour-cpu-s", "0.2"]
    assert checkpoint_bench([*argv, "--dir", str(tmp_path), "--json", str(out)]) == 0

    result = json.loads(out.read_text())
    assert "neighbour" in result["raw"]["window_s"]
    neighbour = result["summary"]["neighbour"]
    assert neighbour["cpu_s"] >= 0.2
    assert neighbour["lost_per_cpu_s"] == neighbour["lost_s"] / neighbour["cpu_s"]
    assert "save_cpu_s" in result["summary"]["async-idle-overlap-direct"]


@pytest.mark.slow
def test_the_null_dcp_defaults_and_pickle_variants_run_the_same_save_path(tmp_path):
    out = tmp_path / "stall.json"
    argv = ["stall", "--model", "gpt_tiny", "--ranks", "1", "--trials", "1", "--steps", "2"]
    variants = "idle:overlap:direct,idle:overlap:null,idle:overlap:direct:dcp"
    variants += ",idle:overlap:direct:pickle"
    argv += ["--variants", variants, "--json", str(out)]
    assert checkpoint_bench([*argv, "--dir", str(tmp_path)]) == 0
    saves = json.loads(out.read_text())["raw"]["async_saves"]
    direct, null = saves["async-idle-overlap-direct"][0], saves["async-idle-overlap-null"][0]
    assert direct["error"] is None and null["error"] is None
    assert null["size_bytes"] < direct["size_bytes"] / 10  # only .metadata and JSON on disk
    baseline = saves["async-idle-overlap-direct-dcpdefaults"][0]  # DCP's stager and planning
    assert baseline["error"] is None
    assert abs(baseline["size_bytes"] - direct["size_bytes"]) < 100  # .metadata names its dir
    pickled = saves["async-idle-overlap-direct-pickle"][0]  # every tensor through torch.save
    assert pickled["error"] is None
    assert abs(pickled["size_bytes"] - direct["size_bytes"]) < 100


@pytest.mark.slow
def test_baselines_can_be_measured_in_every_nth_trial_only(tmp_path):
    out = tmp_path / "stall.json"
    argv = ["stall", "--model", "gpt_tiny", "--ranks", "1", "--trials", "3", "--steps", "1"]
    argv += ["--variants", "idle:overlap:direct", "--baselines-every", "2", "--json", str(out)]
    assert checkpoint_bench([*argv, "--dir", str(tmp_path)]) == 0
    result = json.loads(out.read_text())
    raw = result["raw"]
    assert len(raw["window_s"]["async-idle-overlap-direct"]) == 3  # every trial
    assert len(raw["sync_save_s"]) == len(raw["window_s"]["sync"]) == 2  # trials 0 and 2
    assert len(raw["reference"]["sync"]) == 2 and len(raw["raw_background"]) == 2
    assert result["summary"]["async-idle-overlap-direct"]["lost_over_lost_sync"] is not None
