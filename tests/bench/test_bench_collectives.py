"""The collective benchmark: a real 2-rank run, its table and HDF5 file, failure exits,
correctness checks, and the sweep comparison."""

import json
import math
from pathlib import Path

import h5py
import pytest
import torch

from tests.nccl.cli import run_module
from toolkit.collectives import ops as collective_ops
from toolkit.collectives.busbw import layout
from toolkit.collectives.measure import EXIT_SLOW, EXIT_WRONG, verdict
from toolkit.collectives.ops import build_case
from toolkit.collectives.report import Row, read_h5
from toolkit.config.collectives import CollectivesConfig

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
pytestmark = pytest.mark.usefixtures("clean_nccl_environment")
SMALL = ["collectives.max_bytes=65536", "collectives.iters=3", "collectives.warmup_iters=1"]


def bench(*overrides, module="toolkit.bench.collectives"):
    return run_module(module, *SMALL, *overrides)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bench") / "run"
    proc = bench(f"hydra.run.dir={run_dir}")
    return proc, run_dir


def test_two_ranks_produce_a_complete_correct_table(two_rank_run):
    proc, run_dir = two_rank_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (run_dir / "collectives.txt").read_text()
    assert "2 ranks on 1 node(s), gloo, float32" in table
    for op in OPS:
        assert f"# {op}: Avg bus bandwidth" in table
        assert f"# {op}: out of bounds values : 0 (wrong)" in table
    # all_reduce covers 8 B .. 64 KiB: 14 sizes; all_gather starts where each rank gets 4 floats
    rows, attrs = read_h5(run_dir / "collectives.h5")
    sizes = {op: [r.size_bytes for r in rows if r.op == op] for op in OPS}
    assert sizes["all_reduce"] == [8 << i for i in range(14)]
    assert sizes["all_gather"][0] == 32 and sizes["all_gather"][-1] == 65536
    assert sizes["broadcast"] == sizes["all_reduce"]
    assert attrs["world_size"] == 2 and attrs["backend"] == "gloo"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in attrs["nccl_env"]


def test_hdf5_rows_are_consistent_with_the_formulas(two_rank_run):
    _, run_dir = two_rank_run
    rows, _ = read_h5(run_dir / "collectives.h5")
    for r in rows:
        assert r.wrong == 0 and r.time_us > 0
        assert r.algbw_gbps == pytest.approx(r.size_bytes / 1e9 / (r.time_us * 1e-6))
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(r.op, 0.5)  # 2 ranks
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * factor)
    with h5py.File(run_dir / "collectives.h5") as f:
        assert f["all_reduce"].attrs["avg_busbw_gbps"] == pytest.approx(
            sum(f["all_reduce/busbw_gbps"][:]) / len(f["all_reduce/busbw_gbps"])
        )


@pytest.mark.slow
def test_busbw_below_the_expected_threshold_fails_with_exit_4(tmp_path):
    proc = bench(
        "collectives.ops=[broadcast]",
        "collectives.expected_busbw_gbps=100000",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert proc.returncode == EXIT_SLOW
    assert "error: broadcast: average busbw" in proc.stderr
    assert "is below collectives.expected_busbw_gbps=100000" in proc.stderr
    assert (tmp_path / "run" / "collectives.h5").is_file()  # reported before failing


def test_wrong_results_fail_before_the_threshold_is_considered():
    cfg = CollectivesConfig(expected_busbw_gbps=1.0)
    row = Row("all_reduce", 1024, 256, "float32", "sum", -1, 10.0, 0.1, 0.1, wrong=3)
    code, lines = verdict(cfg, [row])
    assert code == EXIT_WRONG
    assert lines == ["all_reduce at 1024 B: 3 wrong elements (over all ranks)"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_checks_pass_on_correct_output_and_count_corrupted_elements(single_rank_group, op, dtype):
    lay = layout(op, 4096, dtype.itemsize, 1)
    case = build_case(op, lay, dtype, torch.device("cpu"), rank=0, n=1)
    case.refill()
    case.run()
    assert case.wrong() == 0
    case.output[:5] = 99
    assert case.wrong() == 5


def test_inputs_and_checks_work_slice_by_slice(single_rank_group, monkeypatch):
    monkeypatch.setattr(collective_ops, "CHUNK", 7)  # slices that do not divide the buffer
    lay = layout("all_gather", 4000, 4, 1)
    case = build_case("all_gather", lay, torch.float32, torch.device("cpu"), rank=0, n=1)
    case.refill()
    case.run()
    assert case.wrong() == 0
    case.output[-1] += 1
    assert case.wrong() == 1


@pytest.mark.slow
def test_reductions_in_bfloat16_are_checked_on_two_ranks(tmp_path):
    proc = bench(
        "collectives.ops=[all_reduce,reduce_scatter]",
        "collectives.dtype=bfloat16",
        "collectives.redop=max",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows, _ = read_h5(tmp_path / "run" / "collectives.h5")
    assert {r.dtype for r in rows} == {"bfloat16"} and {r.redop for r in rows} == {"max"}
    assert sum(r.wrong for r in rows) == 0


@pytest.mark.slow
def test_baseline_interleaved_adds_its_columns(tmp_path):
    proc = bench(
        "collectives.ops=[all_reduce]",
        "collectives.baseline_repeats=2",
        "collectives.min_bytes=16384",
        f"hydra.run.dir={tmp_path / 'run'}",
        module="toolkit.bench.collectives_baseline",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (tmp_path / "run" / "collectives.txt").read_text()
    assert "base busbw" in table
    assert "# all_reduce: busbw / baseline busbw : median " in table
    rows, _ = read_h5(tmp_path / "run" / "collectives.h5")
    assert [r.size_bytes for r in rows] == [16384, 32768, 65536]
    assert all(r.baseline_busbw_gbps > 0 and r.paired_ratio > 0 for r in rows)
    assert not any(math.isnan(r.baseline_time_us) for r in rows)


@pytest.mark.slow  # ~30 s: two 2-rank runs and the launcher
def test_sweep_of_two_settings_is_ranked_per_size_band(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_module(
        "toolkit.launch",
        "-m",
        "task=bench_collectives",
        "nccl=auto,ethernet",
        "collectives.ops=[all_reduce]",
        *SMALL,
        f"hydra.sweep.dir={sweep}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = run_module("toolkit.bench.compare_collectives", str(sweep), "--bands", "1024")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("  all_reduce")]
    # two bands (< 1 KiB, >= 1 KiB) x two settings, labelled by the override that differs
    assert len(lines) == 4
    assert {line.split()[-1] for line in lines} == {"nccl=auto", "nccl=ethernet"}
    ranking = json.loads((sweep / "compare_collectives.json").read_text())["ranking"]
    assert [(r["band"], r["place"]) for r in ranking] == [
        ("< 1 KiB", 1),
        ("< 1 KiB", 2),
        (">= 1 KiB", 1),
        (">= 1 KiB", 2),
    ]
    assert ranking[0]["busbw_gbps"] >= ranking[1]["busbw_gbps"] and ranking[0]["vs_best"] == 1.0
    assert (
        Path(sweep / "1" / "nccl-env-node0.json").read_text().count('"NCCL_SOCKET_NTHREADS": "4"')
        == 1
    )
