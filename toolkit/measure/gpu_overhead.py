"""The GPU check's overhead step (toolkit.measure.gpu; issue 45 items 3 and 6): what a
small model's step costs beyond its arithmetic on this GPU.

1. The quant benchmark (`toolkit bench quant`, toolkit.bench.quant) with GPU-sized settings
   (QUANT_ARGS): LSTM, TCN and ts_transformer at two sizes, one model and an ensemble of
   16, eager and with the whole step as one CUDA graph; samples/s, the step's split, time
   to the target validation loss and NVML utilisation per configuration, the ensemble's
   model-samples/s against one model's and graphed against eager.
2. Two training runs of ts_transformer (experiment=returns, fp32, compiled) through the
   training benchmark (toolkit.measure.run), parallel.cuda_graphs=off then on: the step time
   of each, and what the run's first lines say (rank 0's log): TF32 on, AdamW's fused
   kernels, CUDA graphs as asked.

A speed-up that is small or below 1 is reported, not failed: the step fails when a run or a
configuration fails, or when a run's first lines do not say what was asked (TF32 on, fused
kernels, CUDA graphs off then on). Nothing starts after its deadline (reported as skipped).

Time on an H100 (an estimate; this step has not run on a GPU yet): the benchmark's 24
configurations at --seconds 1 plus their warm-up, capture and validations, about a minute;
each training run ~20 s of start-up, its compile and 35 steps, about 1.5 minutes for both.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# GPU-sized settings of the quant benchmark: 16 members of 512 windows a step (8,192 window
# passes; the medium transformer's activations, attention on SDPA's math kernel under vmap,
# are ~26 GB by count, twice that at 1024, too close to an H100's 80 GB)
QUANT_ARGS = [
    "--ensemble", "16", "--batch", "512", "--lookback", "64", "--train-samples", "200000",
    "--val-samples", "4096", "--seconds", "1", "--warmup", "2", "--eval-every", "50",
    "--threads", "0",
]  # fmt: skip
GRAPH_RUN = [  # fp32, so that TF32 is what its matmuls run in
    "experiment=returns",
    "precision=fp32",
    "parallel.compile=true",
    "trainer.micro_batch_size=256",
    "cluster.tasks_per_node=1",
    "trainer.time_budget_s=90",
]
GRAPH_WARMUP, GRAPH_STEPS = 5, 30  # the compile happens in the first warm-up step
EXPECTED = {  # what the run's first lines must say, per cuda_graphs setting
    "off": ("tf32: on", "optimizer: AdamW on cuda, fused kernels", "cuda_graphs: off"),
    "on": ("tf32: on", "optimizer: AdamW on cuda, fused kernels", "cuda_graphs: on"),
}
KEYS = ("tf32:", "optimizer:", "cuda_graphs:")

# (overrides, run directory) -> (exit code, bench.json or None): plan_check.run_plan
Runner = Callable[[list[str], Path], tuple[int, dict[str, Any] | None]]
# argv -> exit code: `python -m toolkit.bench.quant ARGV` (bench_process)
Bench = Callable[[list[str]], int]


def first_lines(log_text: str) -> dict[str, str]:
    """The settings lines of a rank's log (tf32, optimizer, cuda_graphs): the text from the
    key on, by key; the first of each."""
    found: dict[str, str] = {}
    for line in log_text.splitlines():
        for key in KEYS:
            at = line.find(key)
            if at >= 0 and key not in found:
                found[key] = line[at:].strip()
    return found


def default_runner(overrides: list[str], out: Path) -> tuple[int, dict[str, Any] | None]:
    from toolkit.measure.plan_check import run_plan

    return run_plan(overrides, out, GRAPH_STEPS, GRAPH_WARMUP)


def graph_runs(out: Path, deadline: float, runner: Runner = default_runner) -> dict[str, Any]:
    """ts_transformer compiled, CUDA graphs off then on: step times, their ratio and the
    first lines each run wrote."""
    runs = []
    for graphs in ("off", "on"):
        run_dir = out / f"cuda_graphs-{graphs}"
        record: dict[str, Any] = {"cuda_graphs": graphs, "run_dir": str(run_dir)}
        if time.perf_counter() > deadline:
            runs.append({**record, "reason": "time budget spent"})
            continue
        code, result = runner([*GRAPH_RUN, f"parallel.cuda_graphs={graphs}"], run_dir)
        record["exit_code"] = code
        log = run_dir / "logs" / "rank0.log"
        record["lines"] = first_lines(log.read_text()) if log.exists() else {}
        if result is None:
            record["reason"] = f"exit {code}; logs in {run_dir / 'logs'}"
        else:
            record["step_time_s_median"] = result["step_time_s_median"]
        runs.append(record)
    section: dict[str, Any] = {"runs": runs}
    times = [r.get("step_time_s_median") for r in runs]
    if all(times):
        section["graphs_speedup"] = times[0] / times[1]  # off over on
    return section


def bench_process(argv: list[str], log: Path) -> int:
    """`python -m toolkit.bench.quant ARGV` in its own process (product code imports no
    benchmark), its output into `log`."""
    root = str(Path(__file__).resolve().parents[2])  # where this toolkit is imported from
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    with log.open("w") as f:
        done = subprocess.run(
            [sys.executable, "-m", "toolkit.bench.quant", *argv],
            stdout=f,
            stderr=f,
            check=False,
            env={**os.environ, "PYTHONPATH": path},
        )
    return done.returncode


def quant_bench(out: Path, deadline: float, bench: Bench | None = None) -> dict[str, Any]:
    """The quant benchmark with QUANT_ARGS into OUT/quant.json (its output in OUT/quant.log);
    its results, or why not."""
    if time.perf_counter() > deadline:
        return {"skipped": "time budget spent"}
    path = out / "quant.json"
    out.mkdir(parents=True, exist_ok=True)
    if bench is None:
        bench = functools.partial(bench_process, log=out / "quant.log")
    try:
        code = bench([*QUANT_ARGS, "--json", str(path)])
    except Exception as exc:  # noqa: BLE001 - the step's failure; the other checks stand
        return {"error": f"{type(exc).__name__}: {exc}"}
    if code != 0 or not path.exists():
        return {"error": f"exit {code}; output in {out / 'quant.log'}"}
    result = json.loads(path.read_text())
    return {k: result[k] for k in ("results", "speedups", "target_loss", "command")}


def overhead_step(out: Path, quant_deadline: float, runs_deadline: float) -> dict[str, Any]:
    return {
        "quant": quant_bench(out / "quant", quant_deadline),
        "graphs": graph_runs(out / "graphs", runs_deadline),
    }


def line_problems(run: dict[str, Any]) -> list[str]:
    """What a finished run's first lines should have said and did not."""
    said = run.get("lines", {})
    return [
        f"expected '{want}...', got '{said.get(key, '(no line)')}'"
        for key, want in zip(KEYS, EXPECTED[run["cuda_graphs"]], strict=True)
        if not said.get(key, "").startswith(want)
    ]


def overhead_ok(section: dict[str, Any]) -> bool:
    """False when a configuration or run failed or a run's lines say the wrong thing."""
    quant = section["quant"]
    if "error" in quant or any("error" in r for r in quant.get("results", [])):
        return False
    for run in section["graphs"]["runs"]:
        if run.get("exit_code", 0) != 0 or ("exit_code" in run and line_problems(run)):
            return False
    return True


def overhead_rows(section: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The step's rows of the GPU check's summary table."""
    rows = []
    quant = section["quant"]
    if "results" not in quant:
        what = quant.get("error") or quant.get("skipped", "")
        rows.append(("bench quant", "FAILED" if "error" in quant else "skipped", what))
    else:
        for r in quant["results"]:
            label = f"quant {r['family']} {r['size']} K={r['members']} {r['mode']}"
            if "error" in r:
                rows.append((label, "FAILED", r["error"]))
                continue
            util = "-" if r["gpu_util_pct"] is None else f"{r['gpu_util_pct']:.0f}%"
            reach = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
            rows.append((
                label,
                f"{r['model_samples_per_s']:,.0f} model-samples/s",
                f"step {r['step_ms']:.2f} ms, GPU util {util}, to target {reach}",
            ))  # fmt: skip
        for s in quant["speedups"]:
            if "ensemble_vs_separate" in s:
                rows.append((
                    f"quant {s['family']} {s['size']} {s['mode']}",
                    f"{s['ensemble_vs_separate']:.1f}x",
                    f"ensemble of {s['members']} in one step vs {s['members']} separate steps",
                ))  # fmt: skip
            else:
                rows.append((
                    f"quant {s['family']} {s['size']} K={s['members']}",
                    f"{s['graphed_vs_eager']:.2f}x",
                    "the whole step as one CUDA graph vs eager",
                ))  # fmt: skip
    graphs = section["graphs"]
    for run in graphs["runs"]:
        label = f"ts_transformer cuda_graphs={run['cuda_graphs']}"
        if "step_time_s_median" not in run:
            failed = run.get("exit_code", 0) != 0
            rows.append((label, "FAILED" if failed else "skipped", run["reason"]))
            continue
        wrong = line_problems(run)
        rows.append((
            label,
            f"{1000 * run['step_time_s_median']:.2f} ms/step",
            "; ".join(wrong) if wrong else " | ".join(run["lines"][k] for k in KEYS),
        ))  # fmt: skip
    if "graphs_speedup" in graphs:
        rows.append(("ts_transformer CUDA graphs", f"{graphs['graphs_speedup']:.2f}x",
                     "step time with cuda_graphs=off over on (compiled, fp32)"))  # fmt: skip
    return rows
