"""Benchmarks of issue 19 (`python -m toolkit.bench.profiling overhead|window|scale`):

* micro: the same outside a window, per step and per collective, in-process (robust to a
  loaded machine);
* overhead: median step time of 2-rank CPU runs with the profiler hook configured but no
  window open, and with the communication timer, against neither (interleaved repeats);
* window: the cost of a profiler window per step (steps inside windows vs outside, one run);
* scale: the report's wall time and peak RSS on a synthetic run of N nodes x G GPUs x H hours
  at 1 s, written by the real writer, first and cached run, and the time of one
  `watch --once` on it (toolkit/bench/report_scale.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from toolkit.bench.telemetry import run_training

VARIANTS = {
    "not_configured": ["telemetry.profile_on_demand=false", "telemetry.comm_timing=false"],
    "profiler_idle": ["telemetry.profile_steps=[100000,100001]", "telemetry.comm_timing=false"],
    "profiler_idle+comm_timing": ["telemetry.profile_steps=[100000,100001]"],
}
COMMON = ["telemetry=off", "data.seq_len=64"]


def overhead(reps: int, steps: int) -> dict:
    medians: dict[str, list[float]] = {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                run = Path(tmp) / f"{name}-{rep}"
                summary = run_training(run, steps, COMMON + VARIANTS[name])
                medians[name].append(summary["median_step_time_s"])
                print(f"rep {rep} {name:26s} {1000 * medians[name][-1]:.2f} ms", flush=True)
    base = medians["not_configured"]
    return {
        "reps": reps,
        "steps": steps,
        "median_step_s": {k: statistics.median(v) for k, v in medians.items()},
        "ratio_vs_not_configured": {
            k: statistics.median([a / b for a, b in zip(v, base, strict=True)])
            for k, v in medians.items()
            if k != "not_configured"
        },
        "per_run_s": medians,
    }


def micro(calls: int) -> dict:
    """In-process per-step costs outside a window, robust to a loaded machine: the profiler
    hook's votes() + after_step() on rank 0 (one stat() of RUN_DIR/profile-now), and one
    all_reduce of 2 floats on a 1-rank gloo group with and without the communication timer."""
    import torch
    import torch.distributed as dist

    from toolkit.config.telemetry import TelemetryConfig
    from toolkit.distributed.commtime import CommTimer
    from toolkit.events import NullSink
    from toolkit.telemetry.profiler import ProfileHook

    class View:
        rank, world_size, step, total_steps = 0, 1, 10, 1_000_000
        device = torch.device("cpu")

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        hook = ProfileHook(TelemetryConfig(), Path(tmp), NullSink())
        view = View()
        t0 = time.perf_counter()
        for _ in range(calls):
            hook.after_step(view, None, hook.votes(view))  # type: ignore[arg-type]
        out["profiler_hook_per_step_us"] = 1e6 * (time.perf_counter() - t0) / calls
        store = Path(tmp) / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        try:
            x = torch.zeros(2)
            for name in ("all_reduce_plain_us", "all_reduce_timed_us"):
                timer = CommTimer().install() if name.endswith("timed_us") else None
                for _ in range(100):
                    dist.all_reduce(x)
                t0 = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(x)
                out[name] = 1e6 * (time.perf_counter() - t0) / calls
                if timer is not None:
                    timer.uninstall()
        finally:
            dist.destroy_process_group()
    out["calls"] = calls
    return out


def window(steps: int, every: int, length: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        extra = [f"telemetry.profile_every={every}", f"telemetry.profile_length={length}"]
        run_training(run, steps, COMMON + extra)
        inside: list[float] = []
        outside: list[float] = []
        windows = []
        extra_s = []  # a window's wall time beyond its steps: start, stop and export
        for rank in (0, 1):
            lines = (run / "metrics" / f"events-rank{rank}.jsonl").read_text().splitlines()
            events = [e for e in map(json.loads, lines) if e["name"] == "profile"]
            windows += [(e["attrs"]["first_step"], e["attrs"]["last_step"], rank) for e in events]
            records = (run / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()
            spans = [(a, b) for a, b, r in windows if r == rank]
            step_time = {}
            for rec in map(json.loads, records[1:]):
                step = rec["step"]
                step_time[step] = rec["step_time_s"]
                into = any(a <= step <= b for a, b in spans)
                (inside if into else outside).append(rec["step_time_s"])
            for e in events:
                covered = range(e["attrs"]["first_step"], e["attrs"]["last_step"] + 1)
                extra_s.append(e["end"] - e["start"] - sum(step_time.get(s, 0) for s in covered))
        sizes = sorted(p.stat().st_size for p in (run / "profiles").rglob("*.json.gz"))
    return {
        "steps": steps,
        "windows": len(windows) // 2,
        "median_step_in_window_s": statistics.median(inside),
        "median_step_outside_s": statistics.median(outside),
        "cost_per_step_s": statistics.median(inside) - statistics.median(outside),
        "window_start_stop_export_s_median": statistics.median(extra_s),
        "trace_bytes_median": sizes[len(sizes) // 2] if sizes else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.profiling")
    sub = parser.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--reps", type=int, default=5)
    o.add_argument("--steps", type=int, default=60)
    w = sub.add_parser("window")
    w.add_argument("--steps", type=int, default=60)
    w.add_argument("--every", type=int, default=10)
    w.add_argument("--length", type=int, default=3)
    m = sub.add_parser("micro")
    m.add_argument("--calls", type=int, default=20000)
    s = sub.add_parser("scale")
    s.add_argument("--nodes", type=int, default=64)
    s.add_argument("--gpus", type=int, default=8)
    s.add_argument("--hours", type=float, default=24.0)
    s.add_argument("--keep", type=Path, default=None, help="generate into (or reuse) this dir")
    s.add_argument("--jobs", type=int, default=2, help="node files written at once")
    s.add_argument("--stream", choices=("auto", "on", "off"), default="on")
    for p in (o, w, m, s):
        p.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.what == "overhead":
        result = overhead(args.reps, args.steps)
    elif args.what == "micro":
        result = micro(args.calls)
    elif args.what == "window":
        result = window(args.steps, args.every, args.length)
    else:
        from toolkit.bench.report_scale import scale

        result = scale(args.nodes, args.gpus, args.hours, args.keep, args.jobs, args.stream)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
