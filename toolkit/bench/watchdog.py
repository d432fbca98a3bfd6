"""`python -m toolkit.bench.watchdog overhead|hang-to-exit [options] [OVERRIDE ...]`

What the hang watchdog costs, and how fast it ends a hung job.

overhead: the toolkit's training step with the watchdog on (fault.hang_watchdog=true: a
heartbeat write at every phase boundary and at every collective's entry and exit) and off,
in the same K processes (gloo on CPU), built from scratch for each of R interleaved
repetitions (on, off; off, on; ...), W warm-up steps skipped, N steps timed on rank 0; the
median over repetitions of on / off step time, in wall and in CPU time of rank 0's process
(baseline: off, the same code without the heartbeat). Also the cost of one heartbeat write
and the collectives per step (the heartbeat's own count), whose product is the expected
overhead, far below what the wall-clock A/B can resolve on a shared machine.

hang-to-exit: the real CLI, 2 local ranks of the tiny model, rank 1 hangs before the step's
all-reduce after step S with fault.hang_timeout_s=T; for R runs, the seconds from the hang
(the last step record's wall time) to the launcher's exit with status 79, and that minus T
(detection granularity, dumps, summary, kill, launcher).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from toolkit.bench.overhead import DEFAULTS as OVERHEAD_DEFAULTS

# The overhead benchmark's job, checkpointing off: only the watchdog differs between A and B.
DEFAULTS = [*OVERHEAD_DEFAULTS, "checkpoint.enabled=false"]


def heartbeat_write_ns(n: int = 200_000) -> float:
    """Nanoseconds per enter+leave pair (two writes), median of 5 batches."""
    from toolkit.telemetry.heartbeat import Heartbeat

    with tempfile.TemporaryDirectory() as d:
        beat = Heartbeat(Path(d) / "b.hb")
        times = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                beat.enter("all_gather")
                beat.leave()
            times.append((time.perf_counter_ns() - t0) / n)
        beat.close()
    return statistics.median(times)


def toolkit_steps(job: Any, env: Any, run_dir: Path, device: Any) -> tuple[list, int]:
    from toolkit.bench.overhead import StepClock
    from toolkit.tasks.train import build_trainer

    trainer = build_trainer(job, env, run_dir, device)
    clock = StepClock()
    trainer.hooks.append(clock)
    try:
        trainer.fit()
    finally:
        trainer.sink.close()
        if trainer.comm_timer is not None:
            trainer.comm_timer.uninstall()
    seq = trainer.heartbeat.entered_seq if trainer.heartbeat is not None else 0
    return clock.ends, seq


def worker(rank: int, world: int, job: Any, args: dict, out: str) -> None:
    import torch.distributed as dist

    from toolkit.bench.overhead import step_seconds
    from toolkit.distributed.env import discover
    from toolkit.distributed.init import init_distributed, shutdown_distributed

    env = discover()
    device = init_distributed(env, 300.0)
    rows = []
    try:
        for rep in range(args["reps"]):
            order = ["on", "off"] if rep % 2 == 0 else ["off", "on"]
            wall, cpu, seqs = {}, {}, {}
            for name in order:
                fault = dataclasses.replace(job.fault, hang_watchdog=name == "on")
                dist.barrier()
                ends, seqs[name] = toolkit_steps(
                    dataclasses.replace(job, fault=fault),
                    env,
                    Path(out) / f"rep{rep}-{name}",
                    device,
                )
                wall[name] = step_seconds([t[0] for t in ends], args["warmup"])
                cpu[name] = step_seconds([t[1] for t in ends], args["warmup"])
            rows.append(
                {
                    "rep": rep,
                    "order": order,
                    "on_step_s": wall["on"],
                    "off_step_s": wall["off"],
                    "ratio": wall["on"] / wall["off"],
                    "cpu_ratio": cpu["on"] / cpu["off"],
                    "collectives_per_step": seqs["on"] / (args["warmup"] + args["steps"]),
                }
            )
            if rank == 0:
                r = rows[-1]
                print(
                    f"rep {rep}: on {1000 * r['on_step_s']:.1f} ms  off "
                    f"{1000 * r['off_step_s']:.1f} ms  ratio {r['ratio']:.3f}  CPU ratio "
                    f"{r['cpu_ratio']:.3f}",
                    flush=True,
                )
    finally:
        shutdown_distributed()
    if rank == 0:
        (Path(out) / "watchdog.json").write_text(json.dumps(rows))


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    from toolkit.bench.ranks import run_ranks
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.data.files import prepare

    keys = {o.split("=", 1)[0] for o in args.overrides}
    overrides = [d for d in DEFAULTS if d.split("=", 1)[0] not in keys]
    overrides += [*args.overrides, f"trainer.steps={args.warmup + args.steps}"]
    job = to_job(compose_raw(overrides))
    from toolkit.config.model import series_shape

    prepare(job.data, *series_shape(job.model))
    out = (args.out or Path(tempfile.mkdtemp(prefix="watchdog-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = {"reps": args.reps, "steps": args.steps, "warmup": args.warmup}
    run_ranks(worker, args.world, out, job, settings, str(out))
    rows = json.loads((out / "watchdog.json").read_text())
    ratios = [r["ratio"] for r in rows]
    cpu = [r["cpu_ratio"] for r in rows]
    write_ns = heartbeat_write_ns()
    per_step = statistics.median(r["collectives_per_step"] for r in rows)
    off = statistics.median(r["off_step_s"] for r in rows)
    return {
        "median_ratio": statistics.median(ratios),
        "ratio_min_max": [min(ratios), max(ratios)],
        "median_cpu_ratio": statistics.median(cpu),
        "cpu_ratio_min_max": [min(cpu), max(cpu)],
        "off_step_s_median": off,
        "on_step_s_median": statistics.median(r["on_step_s"] for r in rows),
        "heartbeat_enter_leave_ns": write_ns,
        "collectives_per_step": per_step,
        # each collective: an enter and a leave; the 3 phase beats per step counted as pairs too
        "expected_overhead_share": (per_step + 3) * write_ns * 1e-9 / off,
        "reps": rows,
        "overrides": overrides,
        "out": str(out),
    }


def hang_to_exit(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo))
    runs = []
    for rep in range(args.reps):
        run_dir = Path(tempfile.mkdtemp(prefix="hang-bench-"))
        cmd = [
            sys.executable,
            "-m",
            "toolkit.launch",
            "model=gpt_tiny",
            "data.seq_len=64",
            "trainer.steps=100000",
            "trainer.progress=false",
            f"fault.hang_at_step={args.hang_step}",
            "fault.hang_rank=1",
            f"fault.hang_timeout_s={args.timeout}",
            f"fault.hang_startup_timeout_s={max(60.0, args.timeout)}",
            *args.overrides,
            f"hydra.run.dir={run_dir}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo, check=False)
        ended = time.time()
        steps = [
            json.loads(x)
            for x in (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
            if x.strip()
        ]
        hung_at = steps[-1]["wall_time"]
        runs.append(
            {
                "rep": rep,
                "exit": proc.returncode,
                "hang_to_exit_s": ended - hung_at,
                "beyond_timeout_s": ended - hung_at - args.timeout,
                "line": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "",
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    return {
        "timeout_s": args.timeout,
        "median_hang_to_exit_s": statistics.median(r["hang_to_exit_s"] for r in runs),
        "max_hang_to_exit_s": max(r["hang_to_exit_s"] for r in runs),
        "median_beyond_timeout_s": statistics.median(r["beyond_timeout_s"] for r in runs),
        "all_exit_79": all(r["exit"] == 79 for r in runs),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m toolkit.bench.watchdog")
    p.add_argument("mode", choices=("overhead", "hang-to-exit"))
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--timeout", type=float, default=10.0, help="hang-to-exit: hang_timeout_s")
    p.add_argument("--hang-step", type=int, default=20, help="hang-to-exit: hang after this step")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    bad = [f"--{k}={getattr(args, k)}: must be >= 1" for k in ("reps", "steps", "warmup", "world")]
    bad = [
        b
        for b, k in zip(bad, ("reps", "steps", "warmup", "world"), strict=True)
        if getattr(args, k) < 1
    ]
    if bad:
        print("\n".join(f"error: {b}" for b in bad), file=sys.stderr)
        return 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = overhead(args) if args.mode == "overhead" else hang_to_exit(args)
    print(json.dumps({k: v for k, v in result.items() if k not in ("reps", "runs")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
