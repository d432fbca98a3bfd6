"""The checkpoint benchmarks run end to end on tiny inputs and report what they measured."""

import json
from itertools import pairwise

import pytest
import torch

from toolkit.bench.checkpoint.__main__ import main as checkpoint_bench
from toolkit.bench.checkpoint.baselines import Neighbour
from toolkit.bench.checkpoint.stall import summarize_stall
from toolkit.bench.checkpoint.writer import measure as writer_bench
from toolkit.bench.checkpoint.writer import write_copy


def test_the_writer_benchmark_writes_exactly_the_state_bytes(tmp_path):
    tensors = [torch.randn(1000), torch.arange(77, dtype=torch.int64)]
    write_copy(tensors, str(tmp_path / "copy.bin"))
    expected = b"".join(t.numpy().tobytes() for t in tensors)
    assert (tmp_path / "copy.bin").read_bytes() == expected


def test_cpu_cost_reports_every_piece_of_a_save(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    assert (
        checkpoint_bench(
            ["cpu", "--gb", "0.02", "--reps", "1", "--dir", str(tmp_path), "--json", str(out)]
        )
        == 0
    )

    rows = {r["piece"]: r for r in json.loads(out.read_text())}
    assert "toolkit writer, O_DIRECT (direct_io=true)" in rows
    assert "plain write + fsync (baseline)" in rows
    assert all(r["wall_s_per_GB"] > 0 and r["GB"] > 0.01 for r in rows.values())


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
def test_the_writer_benchmark_times_every_mode_against_the_bare_steps(tmp_path, monkeypatch):
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        monkeypatch.setenv(name, "")  # it sets them for its one rank: restored afterwards
    result = writer_bench(trials=1, steps=1, out=tmp_path, model="gpt_tiny")
    assert set(result["window_s"]) == {"none", "copy", "thread", "process"}
    assert set(result["lost_s"]) == {"copy", "thread", "process"}
    assert result["bytes"] > 0 and all(len(v) == 1 for v in result["window_s"].values())


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


@pytest.mark.slow
def test_gil_benchmark_times_each_variant_on_the_training_thread(tmp_path):
    out = tmp_path / "gil.json"
    argv = ["gil", "--model", "gpt_tiny", "--reps", "1", "--dir", str(tmp_path), "--json", str(out)]
    assert checkpoint_bench(argv) == 0
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"toolkit", "toolkit-pickle", "toolkit-replan", "dcp", "toolkit-null"}
    for row in summary.values():
        assert row["committed_s"] > 0
        assert 0 < row["save_returned_s"] <= row["kept_out_whole_save_s"] <= row["committed_s"]
