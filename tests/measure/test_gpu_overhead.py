"""The GPU check's step-overhead step on CPU: the quant benchmark it runs (with tiny settings
here), the training runs it compares (stood in for by a runner that writes what the rank's
first lines would say on an H100, produced by the code that writes them), and how it is
judged and shown. The step itself needs a CUDA GPU (tests/measure/test_gpu_check.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bench.test_quant_bench import TINY
from tests.measure.test_gpu_check import h200_report, rendered_summary
from toolkit.bench.quant import parser as quant_parser
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.parallel import ParallelConfig
from toolkit.config.precision import PrecisionConfig
from toolkit.distributed import step_overhead
from toolkit.measure.gpu_overhead import (
    GRAPH_RUN,
    QUANT_ARGS,
    bench_process,
    first_lines,
    graph_runs,
    overhead_ok,
    overhead_rows,
    quant_bench,
)
from toolkit.train.optim import step_kernels

FAR_FUTURE = float("inf")


@pytest.fixture
def h100_first_lines(monkeypatch, caplog):
    """The lines a training rank on an H100 logs for cuda_graphs=off and =on, made by the
    functions that make them (TF32 set and restored around it)."""
    monkeypatch.setattr(step_overhead, "tf32_capable", lambda device: True)
    before = torch.get_float32_matmul_precision()
    cuda = torch.device("cuda", 0)
    lines = {}
    try:
        for graphs in ("off", "on"):
            par = ParallelConfig(compile=True, cuda_graphs=graphs)
            settings = step_overhead.apply_step_settings(PrecisionConfig(), par, cuda)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="toolkit.train.optim"):
                step_kernels(torch.optim.AdamW, "auto", cuda)
            lines[graphs] = [*settings, caplog.records[-1].getMessage()]
    finally:
        torch.set_float32_matmul_precision(before)
        torch.backends.cudnn.allow_tf32 = True
    return lines


class GivenRuns:
    """Stands in for the training benchmark: writes the rank's log with `lines[setting]`
    (prefixed as the entrypoint's formatter does) and returns a step time per setting."""

    def __init__(self, lines: dict[str, list[str]], step_s: dict[str, float | None]):
        self.lines, self.step_s = lines, step_s
        self.calls: list[list[str]] = []

    def __call__(self, overrides: list[str], out: Path) -> tuple[int, dict[str, Any] | None]:
        self.calls.append(overrides)
        graphs = overrides[-1].split("=")[1]
        (out / "logs").mkdir(parents=True)
        text = "".join(
            f"2026-12-05 20:00:00 [rank0] INFO x: {line}\n" for line in self.lines[graphs]
        )
        (out / "logs" / "rank0.log").write_text(text)
        if self.step_s[graphs] is None:
            return 1, None
        return 0, {"step_time_s_median": self.step_s[graphs]}


def test_the_quant_settings_parse_and_the_training_runs_compose():
    args = quant_parser().parse_args(QUANT_ARGS)
    assert (args.ensemble, args.batch, args.graphs, args.threads) == (16, 512, "auto", 0)
    for graphs in ("off", "on"):
        job = to_job(compose_raw([*GRAPH_RUN, f"parallel.cuda_graphs={graphs}"]))
        from toolkit.config.validate import problems

        assert problems(job) == []
        assert (job.parallel.compile, job.precision.name, job.precision.tf32) == (
            True,
            "fp32",
            True,
        )
        assert job.model.name == "ts_transformer" and job.optim.fused == "auto"


def test_graph_runs_read_each_runs_first_lines_and_compare_step_times(tmp_path, h100_first_lines):
    runner = GivenRuns(h100_first_lines, {"off": 0.004, "on": 0.0025})
    section = graph_runs(tmp_path, FAR_FUTURE, runner)
    assert [c[-1] for c in runner.calls] == ["parallel.cuda_graphs=off", "parallel.cuda_graphs=on"]
    off, on = section["runs"]
    assert off["lines"]["cuda_graphs:"] == "cuda_graphs: off (parallel.cuda_graphs=off)"
    assert on["lines"]["tf32:"].startswith("tf32: on (fp32 matmuls on tensor cores")
    assert on["lines"]["optimizer:"] == "optimizer: AdamW on cuda, fused kernels (optim.fused=auto)"
    assert section["graphs_speedup"] == pytest.approx(1.6)
    assert overhead_ok({"quant": {"results": []}, "graphs": section})


def test_a_run_whose_lines_say_otherwise_fails_the_step(tmp_path, h100_first_lines):
    # the "on" run logging what auto says: CUDA graphs were not on
    auto = step_overhead.cuda_graphs(ParallelConfig(compile=True), "cuda")[1]
    lines = {
        **h100_first_lines,
        "on": [*h100_first_lines["on"][:1], auto, h100_first_lines["on"][2]],
    }
    section = graph_runs(tmp_path, FAR_FUTURE, GivenRuns(lines, {"off": 0.004, "on": 0.004}))
    assert not overhead_ok({"quant": {"results": []}, "graphs": section})
    rows = overhead_rows({"quant": {"skipped": "time budget spent"}, "graphs": section})
    on_row = next(r for r in rows if r[0] == "ts_transformer cuda_graphs=on")
    assert on_row[2] == f"expected 'cuda_graphs: on...', got '{auto}'"


def test_a_failed_run_fails_and_runs_past_the_deadline_are_skipped(tmp_path, h100_first_lines):
    section = graph_runs(
        tmp_path / "a", FAR_FUTURE, GivenRuns(h100_first_lines, {"off": 0.004, "on": None})
    )
    assert not overhead_ok({"quant": {"results": []}, "graphs": section})
    assert "graphs_speedup" not in section
    runner = GivenRuns(h100_first_lines, {"off": 0.004, "on": 0.003})
    late = graph_runs(tmp_path / "b", 0.0, runner)
    assert runner.calls == [] and [r["reason"] for r in late["runs"]] == ["time budget spent"] * 2
    assert overhead_ok({"quant": quant_bench(tmp_path, 0.0), "graphs": late})


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_the_quant_benchmark_runs_into_the_steps_directory_and_fills_the_table(
    tmp_path, h100_first_lines
):
    def tiny(argv: list[str]) -> int:  # the real benchmark's process, CPU-sized
        return bench_process([*TINY, *argv[-2:]], tmp_path / "quant.log")  # --json PATH kept

    quant = quant_bench(tmp_path / "quant", FAR_FUTURE, tiny)
    assert (tmp_path / "quant" / "quant.json").exists()
    assert len(quant["results"]) == 6 and quant["target_loss"] == 5.0
    graphs = graph_runs(
        tmp_path / "g", FAR_FUTURE, GivenRuns(h100_first_lines, {"off": 0.004, "on": 0.002})
    )
    section = {"quant": quant, "graphs": graphs}
    assert overhead_ok(section)
    no_rows = {"samples": 0, "runs": 0, "runs_with_samples": 0}
    text = rendered_summary(h200_report([], no_rows, overhead=section), width=400)
    assert "quant tcn small K=2 eager" in text and "model-samples/s" in text
    assert "ensemble of 2 in one step vs 2 separate steps" in text
    graphs_row = next(line for line in text.splitlines() if "ts_transformer CUDA graphs" in line)
    assert "2.00x" in graphs_row and "step time with cuda_graphs=off over on" in graphs_row
    assert "bench quant: cpu" in (tmp_path / "quant.log").read_text()  # its table


def test_a_failing_benchmark_is_the_steps_failure(tmp_path):
    def broken(argv: list[str]) -> int:
        raise RuntimeError("CUDA error: out of memory")

    quant = quant_bench(tmp_path, FAR_FUTURE, broken)
    assert quant == {"error": "RuntimeError: CUDA error: out of memory"}
    assert not overhead_ok({"quant": quant, "graphs": {"runs": []}})
    assert overhead_rows({"quant": quant, "graphs": {"runs": []}}) == [
        ("bench quant", "FAILED", "RuntimeError: CUDA error: out of memory")
    ]


def test_first_lines_takes_each_setting_once():
    text = "a tf32: on (x)\nb cuda_graphs: off (y)\nc tf32: off (z)\n"
    assert first_lines(text) == {"tf32:": "tf32: on (x)", "cuda_graphs:": "cuda_graphs: off (y)"}
