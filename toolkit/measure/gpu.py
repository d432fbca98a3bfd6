"""`python -m toolkit.measure.gpu [--out DIR] [--budget-s S]`: one-command GPU validation.

On a CUDA machine, in about 10 minutes: the data, ensemble and determinism steps (below,
about two minutes together) run first, right after the matmul peak; then no run of step 3
starts after --budget-s, 300 s by default, each capped at 120 s of training; step 6's
benchmark starts by 390 s and its training runs by 460 s; no pick of step 5 starts after
--plans-budget-s, 540 s, each capped at 60 s, so that a late pick ends by about 10.5 minutes:

1. NCCL: a one-rank process group initialises and all-reduces a tensor on GPU 0.
2. bf16 matmul peak of this GPU: a loop of 8192^3 matmuls timed with CUDA events.
3. Training through the normal launcher (toolkit.measure.run, 1 rank, bf16, synthetic
   data): the default model (gpt_small) eager and with torch.compile, gpt_1b eager (its
   compiled run was trimmed to make room for step 6); tokens/s, MFU against the measured
   matmul peak and against the datasheet (hardware preset chosen from the device name:
   h100, h200, a100), and the performance model's memory estimate against
   torch.cuda.max_memory_allocated.
4. NVML telemetry: every run records it with the toolkit's telemetry (toolkit/telemetry:
   the node agent samples NVML every 0.1 s with telemetry=fast into
   RUN_DIR/telemetry/node-<host>-attempt<k>.h5); the check counts the GPU rows written
   and fails when a run's file holds none.
5. The planner's picks (toolkit.measure.gpu_plans; --no-plans skips it): --plan-picks
   layouts of gpt_1b on this GPU spread over the planner's ranking, each run for a few
   steps; predicted vs measured step time and tokens/s, and whether the predicted order
   holds (Spearman). An off prediction is reported, not failed; a failed run fails.
6. Step overhead (toolkit.measure.gpu_overhead; --no-overhead skips it): `toolkit bench
   quant` with GPU-sized settings (LSTM, TCN, ts_transformer; one model vs an ensemble of
   16; eager vs the whole step as one CUDA graph; NVML utilisation), then ts_transformer
   compiled with parallel.cuda_graphs off and on, whose first lines must say TF32 on, fused
   AdamW and CUDA graphs as asked. Speed-ups are reported, not failed.

The determinism step (toolkit.measure.gpu_determinism, about a minute): gpt_small with
trainer.deterministic on, off, on (fresh launches); it fails when the two runs with the mode
on differ in any step's loss or gradient norm, and reports the step time on against off.

The ensemble step (toolkit.measure.gpu_ensemble): one step of K members of a small model
(trainer.ensemble=K, vmap over stacked parameters) against K separate steps, K = 1, 8, 32,
interleaved, medians; it fails only when the members' losses differ from their separate
models' by more than rel 1e-4. Speed-ups are reported, not failed.

The data step (toolkit.measure.gpu_data, about half a minute): the market's samples cut on
the GPU, resident and streamed through pinned buffers and a side stream, must equal the
host loader's bitwise, and tables that no longer fit the GPU's memory must stream instead of
failing; `toolkit bench data --paths` reports the host loader's, the device path's and a
plain gather's samples/s there (reported, not failed).

A short table is printed last; everything is kept in OUT/gpu_check.json. Exit code 0 when
every check passed, 1 otherwise. Without CUDA it says so and exits 0 having run nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from toolkit.measure.gpu_overhead import overhead_ok, overhead_rows, overhead_step
from toolkit.measure.gpu_plans import add_plan_options, plan_rows, plan_step, plans_ok

DATASHEET_PRESETS = {"H200": "h200", "H100": "h100", "A100": "a100"}
MODELS: dict[str, list[str]] = {
    "gpt_small": ["model=gpt_small", "data.seq_len=512", "trainer.micro_batch_size=16"],
    "gpt_1b": ["model=gpt_1b", "data.seq_len=2048", "trainer.micro_batch_size=4"],
}
# (model, compiled): gpt_1b's compiled run was trimmed to make room for step 6 (~2 minutes)
RUNS = [("gpt_small", False), ("gpt_small", True), ("gpt_1b", False)]
MEMORY_TOLERANCE = 0.10
RUN_BUDGET_S = 120  # per run, from the start of training
# No run starts after this many seconds (the short steps take ~2 minutes before them).
START_BUDGET_S = 300.0
QUANT_START_S = 390.0  # step 6's benchmark starts by then (about a minute)
GRAPH_RUNS_START_S = 460.0  # and its two training runs (about 45 s each)


def hardware_preset(device_name: str) -> str | None:
    """The conf/hardware preset for a device name ('NVIDIA H100 80GB HBM3' -> 'h100')."""
    upper = device_name.upper()
    return next((p for key, p in DATASHEET_PRESETS.items() if key in upper), None)


def no_cuda_message() -> str:
    return (
        "toolkit.measure.gpu: no CUDA device visible (torch.cuda.is_available() is False; "
        f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}). "
        "The GPU checks need an NVIDIA GPU; nothing was run."
    )


def check_nccl(timeout_s: float = 60.0) -> dict[str, Any]:
    """Initialise a one-rank NCCL process group on GPU 0 and all-reduce a tensor."""
    import torch.distributed as dist

    from toolkit.distributed.env import free_port

    t0 = time.perf_counter()
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=torch.device("cuda", 0),
    )
    try:
        x = torch.full((1 << 20,), 3.0, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        ok = bool(torch.all(x == 3.0).item())
        version = ".".join(map(str, torch.cuda.nccl.version()))
    finally:
        dist.destroy_process_group()
    return {"ok": ok, "nccl_version": version, "seconds": time.perf_counter() - t0}


def matmul_peak(
    device: torch.device, dtype: torch.dtype = torch.bfloat16, n: int = 8192, iters: int = 50
) -> float:
    """Achieved FLOP/s of a square matmul loop (2 n^3 FLOPs each), after a warm-up."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        end.record()
        torch.cuda.synchronize(device)
        elapsed = start.elapsed_time(end) / 1000.0
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        elapsed = time.perf_counter() - t0
    del a, b, c
    return 2.0 * n**3 * iters / elapsed


def run_model(
    name: str, compile: bool, preset: str | None, out: Path, warmup: int, steps: int
) -> dict[str, Any]:
    """One benchmark run through the launcher; its one-line summary, or the failure."""
    from toolkit.measure import run as bench_train

    run_dir = out / f"{name}-{'compile' if compile else 'eager'}"
    argv = [
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--out",
        str(run_dir),
        *MODELS[name],
        "precision=bf16",
        "data=synthetic",
        "cluster.tasks_per_node=1",
        f"parallel.compile={'true' if compile else 'false'}",
        "telemetry=fast",  # NVML every 0.1 s into RUN_DIR/telemetry (the node agent)
        f"trainer.time_budget_s={RUN_BUDGET_S}",  # compile included: it happens in step 1
        *([f"hardware={preset}"] if preset else []),
    ]
    t0 = time.perf_counter()
    code = bench_train.main(argv)
    result: dict[str, Any] = {"name": name, "compile": compile, "exit_code": code}
    result["seconds"] = time.perf_counter() - t0
    if code == 0 and (run_dir / "bench.json").exists():
        result.update(json.loads((run_dir / "bench.json").read_text()))
    else:
        result["reason"] = f"exit {code}; logs in {run_dir / 'logs'}"
    return result


def gpu_telemetry_samples(run_dir: Path) -> int:
    """GPU rows (all node files, all GPUs) the toolkit's telemetry wrote for a run."""
    from toolkit.telemetry.read import NoTelemetry, load_run

    try:
        run = load_run(run_dir)
    except NoTelemetry:
        return 0
    try:
        return sum(len(table) for node in run.nodes for table in node.gpus.values())
    finally:
        run.close()


def mfu_against(result: dict[str, Any], peak_flops: float) -> float | None:
    """MFU of a run against another peak: its datasheet MFU rescaled."""
    from toolkit.config.compose import load_job

    if "mfu" not in result or peak_flops <= 0:
        return None
    job = load_job(Path(result["run_dir"]) / "config.yaml")
    return result["mfu"] * job.hardware.peak_flops_bf16 / peak_flops


def summary_table(report: dict[str, Any]):
    from rich.table import Table

    table = Table(title=f"GPU check: {report['device']}")
    table.add_column("check")
    table.add_column("result", justify="right")
    table.add_column("detail")
    nccl = report["nccl"]
    table.add_row(
        "NCCL init (1 GPU)",
        "ok" if nccl.get("ok") else "FAILED",
        nccl.get("error") or f"NCCL {nccl['nccl_version']}, {nccl['seconds']:.1f} s",
    )
    peak, sheet = report["matmul_peak_flops"], report["datasheet_peak_flops"]
    table.add_row(
        "bf16 matmul peak",
        f"{peak / 1e12:,.0f} TFLOP/s",
        f"{100 * peak / sheet:.0f}% of datasheet {sheet / 1e12:,.0f}" if sheet else "no datasheet",
    )
    for r in report["runs"]:
        label = f"{r['name']} {'compile' if r['compile'] else 'eager'}"
        if "tokens_per_s" not in r:
            table.add_row(label, "FAILED" if r.get("exit_code") else "skipped", r.get("reason", ""))
            continue
        mem = r.get("memory_ratio")
        table.add_row(
            label,
            f"{r['tokens_per_s']:,.0f} tok/s",
            f"MFU {100 * (r['mfu_measured_peak'] or 0):.1f}% of measured peak, "
            + (f"{100 * r['mfu']:.1f}% of datasheet; " if sheet else "")
            + (
                f"memory meas/pred {mem:.2f} "
                f"({'within' if abs(mem - 1) <= MEMORY_TOLERANCE else 'outside'} 10%)"
                if mem
                else "memory -"
            ),
        )
    if "plans" in report:
        for row in plan_rows(report["plans"]):
            table.add_row(*row)
    overhead = report.get("overhead", {"skipped": "not run"})
    if "skipped" in overhead:
        table.add_row("step overhead", "skipped", overhead["skipped"])
    else:
        for row in overhead_rows(overhead):
            table.add_row(*row)
    if "ensemble" in report:
        from toolkit.measure.gpu_ensemble import ensemble_summary

        for line in ensemble_summary(report["ensemble"]):
            ok = "ok" if report["ensemble"]["ok"] else "FAILED"
            table.add_row("ensemble vs K separate steps", ok, line)
    tel = report["telemetry"]
    table.add_row(
        "NVML telemetry",
        f"{tel['samples']} GPU rows",
        f"{tel['runs_with_samples']}/{tel['runs']} runs' node files under RUN_DIR/telemetry"
        + ("" if tel["samples"] else " (EMPTY)"),
    )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.measure.gpu")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--budget-s", type=float, default=START_BUDGET_S, help="start no run after this"
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    add_plan_options(parser)
    parser.add_argument(
        "--no-overhead", action="store_true", help="skip step 6 (bench quant, CUDA graph runs)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print(no_cuda_message())
        return 0
    started = time.perf_counter()
    out = (args.out or Path("outputs/gpu_check") / time.strftime("%Y-%m-%d/%H-%M-%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    preset = hardware_preset(name)
    report: dict[str, Any] = {"device": name, "hardware_preset": preset, "runs": []}

    try:
        report["nccl"] = check_nccl()
    except Exception as exc:  # noqa: BLE001 - report and carry on with the other checks
        report["nccl"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    report["matmul_peak_flops"] = matmul_peak(device)
    torch.cuda.empty_cache()
    from toolkit.config.compose import compose_raw, to_job

    report["datasheet_peak_flops"] = (
        to_job(compose_raw([f"hardware={preset}"])).hardware.peak_flops_bf16 if preset else 0.0
    )

    # The short steps first (about two minutes together): each has its verdict, none a deadline.
    from toolkit.measure.gpu_data import data_step  # device-resident data (issue 45)

    report["data"] = data_step(out / "data", device)
    from toolkit.measure.gpu_ensemble import ensemble_step  # K models in one step (issue 45)

    report["ensemble"] = ensemble_step(out / "ensemble", device)  # ~15 s of it on an H100
    from toolkit.measure.gpu_determinism import determinism_step  # issue 47, ~1 minute

    report["determinism"] = determinism_step(
        out / "determinism",
        ["model=gpt_small", "trainer.steps=12", "trainer.progress=false", "telemetry=off"],
        order=("on", "off", "on"),
    )
    for model, compile in RUNS:
        if time.perf_counter() - started > args.budget_s:
            report["runs"].append(
                {"name": model, "compile": compile, "reason": "time budget spent"}
            )
            continue
        r = run_model(model, compile, preset, out, args.warmup, args.steps)
        if "tokens_per_s" in r:
            r["mfu_measured_peak"] = mfu_against(r, report["matmul_peak_flops"])
            predicted = r.get("predicted_peak_memory_bytes")
            measured = r.get("peak_memory_growth_bytes")
            r["memory_ratio"] = measured / predicted if measured and predicted else None
            r["telemetry_gpu_rows"] = gpu_telemetry_samples(Path(r["run_dir"]))
        report["runs"].append(r)
    report["overhead"] = (
        {"skipped": "--no-overhead"}
        if args.no_overhead
        else overhead_step(out / "overhead", started + QUANT_START_S, started + GRAPH_RUNS_START_S)
    )
    report["plans"] = (
        {"skipped": "--no-plans"}
        if args.no_plans
        else plan_step(preset, args.plan_picks, out / "plans", started + args.plans_budget_s)
    )
    finished = [r for r in report["runs"] if "tokens_per_s" in r]
    report["telemetry"] = {
        "samples": sum(r["telemetry_gpu_rows"] for r in finished),
        "runs": len(finished),
        "runs_with_samples": sum(1 for r in finished if r["telemetry_gpu_rows"] > 0),
    }
    report["seconds"] = time.perf_counter() - started
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))

    from rich.console import Console

    ok = (
        report["nccl"].get("ok", False)
        and report["telemetry"]["runs_with_samples"] == report["telemetry"]["runs"] > 0
        and all("tokens_per_s" in r for r in report["runs"])
        and report["ensemble"]["ok"]
        and plans_ok(report["plans"])
        and report["data"]["ok"]
        and report["determinism"]["ok"]
        and ("skipped" in report["overhead"] or overhead_ok(report["overhead"]))
    )
    table = summary_table(report)
    table.caption = f"{'passed' if ok else 'FAILED'} in {report['seconds']:.0f} s; details: {out}"
    Console(width=160).print(table)
    data = report["data"]
    print(
        f"{data['placement']}; equal to the host loader's batches: {data['bitwise_equal']}; "
        f"samples/s (medians): {data.get('paths', {}).get('median_samples_per_s')}"
    )
    det = report["determinism"]
    print(
        f"trainer.deterministic: runs bitwise equal: {det['bitwise_equal']}; step time on/off "
        f"{det.get('on_over_off')} (medians {det['median_step_s']}); errors {det['errors']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
