"""`python -m toolkit.measure.run [--warmup W] [--steps N] [-m] [OVERRIDE ...]`: benchmark a
training configuration through the normal launcher and executor.

It launches `task=bench_train` (the training task plus memory probes) with
trainer.steps = W + N, then reads the per-step records every rank wrote
(RUN_DIR/metrics/rank<k>.jsonl), drops the W warm-up steps and reports, for the N measured
steps: median/p10/p90 step time, tokens/s per device and in total, MFU, peak memory,
data-wait share, the phase split, and the performance model's prediction beside it.
Results go to RUN_DIR/bench/results.h5 (steps, evals, summary, prediction, config.yaml,
launch.yaml, env.json) and RUN_DIR/bench/result.json; the one-line JSON summary is printed
last. With -m every combination runs (one Slurm array on cluster=slurm) and a comparison
table, SWEEP_DIR/comparison.png and, when the world size varies, scaling.png follow.

Time to target: --target-loss X evaluates every --eval-every steps and stops at the first
validation loss <= X (trainer.steps = W + N is then the step budget; trainer.time_budget_s
bounds wall time); the summary gains time_to_target_s, tokens_to_target, steps_to_target.

--analyze DIR re-reads a finished run or sweep directory (e.g. a detached Slurm job).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

RESERVED = ("trainer.steps=", "task=", "hydra.run.dir=", "hydra.sweep.dir=")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m toolkit.measure.run")
    p.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated values")
    p.add_argument("--warmup", type=int, default=3, help="steps excluded from the statistics")
    p.add_argument(
        "--steps", type=int, default=20, help="measured steps (the budget with --target-loss)"
    )
    p.add_argument("--target-loss", type=float, default=None, help="stop at this validation loss")
    p.add_argument(
        "--eval-every", type=int, default=10, help="evaluation interval with --target-loss"
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (sweep directory with -m)")
    p.add_argument(
        "--exact-rss",
        action="store_true",
        help="CPU memory check: make freed memory leave the RSS (slows steps; not for timing)",
    )
    p.add_argument(
        "--analyze", type=Path, default=None, help="only analyze this finished run/sweep"
    )
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.warmup < 0:
        problems.append(f"--warmup={args.warmup}: must be >= 0")
    if args.steps < 1:
        problems.append(f"--steps={args.steps}: must be >= 1")
    if args.eval_every < 1:
        problems.append(f"--eval-every={args.eval_every}: must be >= 1")
    for o in args.overrides:
        if o.startswith(RESERVED):
            problems.append(
                f"{o}: set by the benchmark; use --steps/--warmup for the step count and "
                "--out for the directory"
            )
    return problems


def launch_overrides(args: argparse.Namespace, out: Path) -> list[str]:
    extra = [
        "task=bench_train",
        f"trainer.steps={args.warmup + args.steps}",
        "trainer.progress=false",
        f"hydra.{'sweep' if args.multirun else 'run'}.dir={out}",
    ]
    if args.target_loss is not None:
        extra += [
            f"trainer.target_val_loss={args.target_loss}",
            f"trainer.eval_every={args.eval_every}",
        ]
    return [*args.overrides, *extra]


def run_dirs(out: Path) -> list[Path]:
    """The run directory itself, or a sweep's numbered run directories in order."""
    if (out / "config.yaml").exists():
        return [out]
    numbered = [p for p in out.iterdir() if p.is_dir() and p.name.isdigit()] if out.is_dir() else []
    return sorted((p for p in numbered if (p / "config.yaml").exists()), key=lambda p: int(p.name))


def analyze(out: Path, warmup: int) -> dict[str, Any]:
    """Analyze every run under `out`; print tables; return the one-line summary object."""
    from rich.console import Console

    from toolkit.measure.compare import add_scaling_efficiency, comparison_table, mark_varying, plot
    from toolkit.measure.results import analyze_run
    from toolkit.perfmodel.report import prediction_table, split_table

    console = Console(width=200) if not sys.stdout.isatty() else Console()
    dirs = run_dirs(out)
    if not dirs:
        raise FileNotFoundError(f"{out}: no run directory (config.yaml) found")
    summaries = []
    for d in dirs:
        try:
            summary, prediction = analyze_run(d, warmup)
        except (FileNotFoundError, ValueError) as exc:
            if len(dirs) == 1:
                raise
            console.print(f"[red]skipped {d}: {exc}")  # a failed run of a sweep
            continue
        measured = {
            **summary,
            "step_time_s": summary["step_time_s_median"],
            "dominant": f"{summary['measured_dominant']} "
            f"({'matches' if summary['dominant_match'] else 'differs'})",
        }
        title = f"{' '.join(summary['overrides']) or d.name}: model vs measured"
        console.print(prediction_table(prediction, measured, title=title))
        console.print(split_table(summary))
        summaries.append(summary)
    if len(dirs) == 1 and dirs[0] == out:
        return summaries[0]
    if not summaries:
        raise ValueError(f"{out}: no run of the sweep has step records")
    mark_varying(summaries)
    add_scaling_efficiency(summaries)
    console.print(f"sweep directory: {out}")
    console.print(comparison_table(summaries, title="benchmark sweep"))
    plots = plot(summaries, out)
    sweep = {"sweep_dir": str(out), "plots": [str(p) for p in plots], "runs": summaries}
    (out / "sweep.json").write_text(json.dumps(sweep) + "\n")
    return sweep


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    problems = check_args(args)
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    code = 0
    if args.analyze is not None:
        out = args.analyze.resolve()
    else:
        from toolkit.launch import main as launch

        if args.exact_rss:
            # glibc keeps freed blocks below its (adaptive) mmap threshold in its arenas, so
            # the RSS overstates live memory; a fixed small threshold maps and unmaps every
            # large block. The ranks inherit the environment.
            os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"

        out = (args.out or Path("outputs/bench") / time.strftime("%Y-%m-%d/%H-%M-%S")).resolve()
        code = launch([*(["-m"] if args.multirun else []), *launch_overrides(args, out)])
        if code != 0:
            print(f"error: a benchmark run failed (exit {code}); see {out}", file=sys.stderr)
            if not args.multirun:
                return code  # a sweep still reports the runs that finished
        if not any((d / "metrics").is_dir() for d in run_dirs(out)):
            print(
                f"submitted without waiting; analyze later: python -m toolkit.measure.run "
                f"--analyze {out} --warmup {args.warmup}"
            )
            return 0
    try:
        result = analyze(out, args.warmup)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    line = json.dumps(result if "runs" not in result else compact(result))
    (out / "bench.json").write_text(line + "\n")
    print(line)
    return code


def compact(sweep: dict[str, Any]) -> dict[str, Any]:
    """The sweep's one-line summary: per run only the headline numbers."""
    keys = (
        "run_dir",
        "varying",
        "world_size",
        "step_time_s_median",
        "tokens_per_s",
        "tokens_per_s_per_device",
        "mfu",
        "peak_memory_bytes",
        "data_wait_share",
        "predicted_step_s",
        "step_time_ratio",
        "scaling_efficiency",
        "reached_target",
        "time_to_target_s",
        "tokens_to_target",
    )
    runs = [{k: r.get(k) for k in keys} for r in sweep["runs"]]
    return {"sweep_dir": sweep["sweep_dir"], "plots": sweep["plots"], "runs": runs}


if __name__ == "__main__":
    sys.exit(main())
