"""`python -m toolkit.bench.tradeoffs [--models M,...] [--settings S,...] [--steps N]
[--cost PRICES.yaml] [OVERRIDE ...]`: what each memory/precision setting costs and buys.

The matrix is precision fp32/bf16 x activation checkpointing off/on x model.kernels
torch/liger x optim adamw/adamw8bit (settings named like `bf16-ac-liger-adamw8bit`). Every
setting of every model trains the same tokens (same seed, data, steps) through the training
benchmark (`python -m toolkit.measure.run`, the real launcher and ranks), --rounds times
round-robin, and the table reports per setting: median step time (the median of the runs'
medians), peak memory (the step records' peak: CUDA max_memory_allocated, or on CPU the
process's max RSS, with its growth over the memory in use before the model was built) and
the performance model's predicted peak for the setting (memory options included), final
validation loss, the divergence of its per-step loss from the fp32 reference
(`fp32-noac-torch-adamw`, always run: max and final |delta loss|), tokens/s and, with --cost (the planner's price table: hardware preset ->
price per device-hour), the cost per million tokens measured on the run's hardware and
predicted by the performance model on every priced preset. One setting (--repeat, the
reference by default) runs at least twice, and every setting with --rounds >= 2: are the
losses of its runs bitwise identical?

A setting whose code is missing (model.kernels=liger without toolkit.kernels.liger, an
optimizer without its conf/optim preset, a library not installed) is listed with the reason
and not run. Out: OUT/tradeoffs.md (the table), tradeoffs.json, tradeoffs.png.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.measure.model_check import MODEL_OVERRIDES

PRECISIONS = ("fp32", "bf16")
CHECKPOINTING = ("noac", "ac")
KERNELS = ("torch", "liger")
OPTIMIZERS = ("adamw", "adamw8bit")
REFERENCE = "fp32-noac-torch-adamw"
PREDICTED = "cost_per_mtok_predicted_"


@dataclass(frozen=True)
class Setting:
    precision: str
    checkpointing: str
    kernels: str
    optimizer: str

    @property
    def name(self) -> str:
        return f"{self.precision}-{self.checkpointing}-{self.kernels}-{self.optimizer}"

    def overrides(self) -> list[str]:
        return [
            f"precision={self.precision}",
            f"parallel.activation_checkpointing={str(self.checkpointing == 'ac').lower()}",
            f"model.kernels={self.kernels}",
            f"optim={self.optimizer}",
        ]


MATRIX = tuple(
    Setting(*combo) for combo in itertools.product(PRECISIONS, CHECKPOINTING, KERNELS, OPTIMIZERS)
)


def select(patterns: str) -> list[Setting]:
    """The settings matching any comma-separated name or glob, the reference first."""
    wanted = [p for p in patterns.split(",") if p] or ["*"]
    chosen = [s for s in MATRIX if any(fnmatch.fnmatchcase(s.name, p) for p in wanted)]
    reference = next(s for s in MATRIX if s.name == REFERENCE)
    return [reference, *(s for s in chosen if s != reference)]


def unavailable(setting: Setting, model_overrides: list[str]) -> str:
    """Why `setting` cannot run here ('' when it can): its config does not compose, or the
    code behind it is not installed on this branch."""
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.config.errors import ConfigError
    from toolkit.kernels.backend import importable, triton_runs_on

    try:
        job = to_job(compose_raw([*model_overrides, *setting.overrides()]))
    except (ConfigError, ValueError) as exc:
        lines = getattr(exc, "problems", None) or [str(exc)]
        return f"config: {lines[0]}"
    if job.model.kernels == "liger":
        for module in ("toolkit.kernels.liger", "liger_kernel"):
            if not importable(module):
                return f"model.kernels=liger: {module} is not installed on this branch"
        device = "cuda" if job.cluster.gpus_per_node > 0 else "cpu"
        if not triton_runs_on(device):
            return f"model.kernels=liger: Triton cannot run on {device} (TRITON_INTERPRET=1?)"
    if job.optim.name != "adamw" and not importable("torchao"):
        return f"optim={job.optim.name}: torchao is not installed"
    return ""


def losses(run_dir: Path) -> list[float]:
    """Rank 0's loss at every step (warm-up included: the whole curve)."""
    from toolkit.events import read_steps
    from toolkit.measure.results import rank_files

    return [float(r["loss"]) for r in read_steps(rank_files(run_dir, "rank")[0])]


def divergence(curve: list[float], reference: list[float]) -> dict[str, float]:
    """max and final |delta loss| against the reference curve, step by step."""
    deltas = [abs(a - b) for a, b in zip(curve, reference, strict=True)]
    return {"max_abs_delta_loss": max(deltas), "final_abs_delta_loss": deltas[-1]}


def costs(
    summary: dict[str, Any], tokens_per_s: float, overrides: list[str], prices: dict[str, float]
) -> dict[str, float]:
    """Price per million tokens: measured on the run's own hardware preset (when priced), and
    predicted by the performance model (this setting's layout and memory options) on every
    priced preset (None where it does not fit)."""
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.perfmodel import predict_job

    out: dict[str, Any] = {}
    world = summary["world_size"]
    if summary["hardware"] in prices and tokens_per_s > 0:
        per_s = prices[summary["hardware"]] * world / 3600.0
        out["cost_per_mtok_measured"] = per_s / tokens_per_s * 1e6
    for name, price in prices.items():
        job = to_job(compose_raw([*overrides, f"hardware={name}"]))
        pred = predict_job(job, world)
        rate = pred.tokens_per_s
        out[f"{PREDICTED}{name}"] = (
            price * world / 3600.0 / rate * 1e6 if pred.fits and rate > 0 else None
        )
    return out


def run_setting(
    args: argparse.Namespace, run: Path, overrides: list[str]
) -> tuple[dict[str, Any] | None, str]:
    """(the benchmark summary, '') or (None, why it failed)."""
    from toolkit.measure.run import main as bench

    argv = ["--warmup", str(args.warmup), "--steps", str(args.steps), "--out", str(run)]
    code = bench([*argv, *overrides])
    result = run / "bench" / "result.json"
    if code != 0 or not result.exists():
        return None, f"failed (exit {code}); see {run}"
    return json.loads(result.read_text()), ""


def run_matrix(args: argparse.Namespace, out: Path, prices: dict[str, float]) -> list[dict]:
    """Every selected setting of every model, --rounds times round-robin (A B C A B C: a
    shared machine's drifts fall on every setting alike; the step time is the median of the
    runs' medians); the --repeat setting runs at least twice."""
    rows: list[dict[str, Any]] = []
    for model in args.models.split(","):
        model_overrides = [f"model={model}", *MODEL_OVERRIDES.get(model, []), *args.overrides]
        runnable = []
        for setting in select(args.settings):
            row: dict[str, Any] = {"model": model, "setting": setting.name}
            rows.append(row)
            why = unavailable(setting, model_overrides)
            if why:
                row.update(status="unavailable", reason=why)
                continue
            runs = max(args.rounds, 2 if setting.name == args.repeat else 1)
            row.update(status="ran", runs=runs, curves=[], summaries=[])
            runnable.append((row, setting, [*model_overrides, *setting.overrides()]))
        for i in range(max((row["runs"] for row, _, _ in runnable), default=0)):
            for row, setting, overrides in runnable:
                if row["status"] != "ran" or i >= row["runs"]:
                    continue
                run = out / model / (setting.name + ("" if i == 0 else f"-run{i + 1}"))
                summary, why = run_setting(args, run, overrides)
                if summary is None:
                    row.update(status="failed", reason=why)
                    continue
                row["curves"].append(losses(run))
                row["summaries"].append(summary)
        reference = next((r for r, s, _ in runnable if s.name == REFERENCE), None)
        for row, _, overrides in runnable:
            if row["status"] == "ran":
                summarise(row, reference if reference and reference["status"] == "ran" else None)
                if prices:
                    row.update(costs(row["summary"], row["tokens_per_s"], overrides, prices))
        for row, _, _ in runnable:
            for key in ("curves", "summaries", "summary"):
                row.pop(key, None)
    return rows


def summarise(row: dict[str, Any], reference: dict[str, Any] | None) -> None:
    """The row's figures from its runs: the first run's loss curve, validation loss and
    memory; the median of the runs' median step times; bitwise identity across runs."""
    first, curves = row["summaries"][0], row["curves"]
    row["summary"] = first
    row["run_dir"] = first["run_dir"]
    row["losses"] = curves[0]
    for key in (
        "peak_memory_bytes",
        "peak_memory_growth_bytes",
        "predicted_peak_memory_bytes",
        "val_loss",
    ):
        row[key] = first[key]
    medians = [s["step_time_s_median"] for s in row["summaries"]]
    row["step_time_s_runs"] = medians
    row["step_time_s_median"] = statistics.median(medians)
    row["tokens_per_s"] = tokens_per_step(first) / row["step_time_s_median"]
    row["tokens"] = len(curves[0]) * tokens_per_step(first)
    if len(curves) > 1:
        row["bitwise_reproducible"] = all(c == curves[0] for c in curves[1:])
        row["repeat_max_abs_delta_loss"] = max(
            divergence(c, curves[0])["max_abs_delta_loss"] for c in curves[1:]
        )
    if reference is not None:
        row.update(divergence(curves[0], reference["curves"][0]))


def tokens_per_step(summary: dict[str, Any]) -> int:
    return (
        summary["micro_batch_size"]
        * summary["grad_accum"]
        * summary["world_size"]
        * summary["seq_len"]
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m toolkit.bench.tradeoffs")
    p.add_argument("--models", default="gpt_tiny", help="comma-separated model presets")
    p.add_argument(
        "--settings",
        default="",
        help=f"comma-separated names or globs (default all; {REFERENCE} always)",
    )
    p.add_argument("--steps", type=int, default=20, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the step time")
    p.add_argument("--repeat", default=REFERENCE, help="the setting run twice (bitwise check)")
    p.add_argument("--rounds", type=int, default=1, help="runs of every setting, round-robin")
    p.add_argument("--cost", type=Path, default=None, help="YAML: hardware preset -> $/device-hour")
    p.add_argument("--out", type=Path, default=None, help="output directory")
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    from toolkit.config.compose import group_options
    from toolkit.measure.run import RESERVED

    problems = []
    if args.steps < 1:
        problems.append(f"--steps={args.steps}: must be >= 1")
    if args.rounds < 1:
        problems.append(f"--rounds={args.rounds}: must be >= 1")
    if args.warmup < 0:
        problems.append(f"--warmup={args.warmup}: must be >= 0")
    known = group_options("model")
    for model in args.models.split(","):
        if model not in known:
            problems.append(f"--models: {model} unknown; allowed: {', '.join(known)}")
    names = [s.name for s in select(args.settings)]
    if len(names) == 1 and args.settings and REFERENCE not in args.settings:
        problems.append(
            f"--settings={args.settings}: matches none of {', '.join(s.name for s in MATRIX)}"
        )
    if args.repeat and args.repeat not in names:
        problems.append(f"--repeat={args.repeat}: not among the selected settings")
    for o in args.overrides:
        if o.startswith((*RESERVED, "model=", "precision=", "optim=", "model.kernels=")) or (
            o.startswith("parallel.activation_checkpointing=")
        ):
            problems.append(f"{o}: set by the matrix; use --models/--settings")
    return problems


def main(argv: list[str] | None = None) -> int:
    from toolkit.bench.tradeoffs_report import plot, table

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    problems = check_args(args)
    prices: dict[str, float] = {}
    if args.cost is not None:
        from toolkit.perfmodel.prices import read_prices

        try:
            prices = read_prices(args.cost)
        except (ValueError, OSError) as exc:
            problems.append(str(exc))
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    out = (
        args.out or Path("outputs/bench/tradeoffs") / time.strftime("%Y-%m-%d/%H-%M-%S")
    ).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    load_start = os.getloadavg()
    rows = run_matrix(args, out, prices)
    text = table(rows, prices)
    load = os.getloadavg()
    header = (
        f"tradeoffs: {args.models}, {args.warmup}+{args.steps} steps per run, "
        f"{args.rounds} round(s), started {started} UTC, load average (1/5/15 min) at the "
        f"start {' '.join(f'{x:.2f}' for x in load_start)}, at the end "
        f"{' '.join(f'{x:.2f}' for x in load)}"
    )
    (out / "tradeoffs.md").write_text(header + "\n\n" + text + "\n")
    result = {
        "command": "python -m toolkit.bench.tradeoffs " + " ".join(argv),
        "started_utc": started,
        "load_average_start": load_start,
        "load_average_end": load,
        "reference": REFERENCE,
        "prices": prices,
        "rows": rows,
    }
    (out / "tradeoffs.json").write_text(json.dumps(result) + "\n")
    png = plot(rows, out / "tradeoffs.png")
    print(header)
    print(text)
    print(f"written: {out / 'tradeoffs.md'}, {out / 'tradeoffs.json'}, {png}")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
