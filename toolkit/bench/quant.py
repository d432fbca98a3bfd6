"""`toolkit bench quant [--families lstm tcn transformer] [--sizes small medium] [--ensemble K]
[--graphs auto|on|off] ...`: a training benchmark for small quant models.

Three families (an LSTM, a TCN, the built-in ts_transformer; toolkit.bench.quant_models) at
two sizes each train on order-book-like windows (toolkit.bench.quant_data: seeded, with an
autocorrelated mid-price and a target a window can predict), each as one model and as an
ensemble of K members in one step (torch.func; toolkit.bench.quant_step), on a GPU also with
the whole step as one CUDA graph. Per configuration: samples/s (and model-samples/s: K per
sample for an ensemble), the data wait, the step's split (data / forward-backward /
optimizer), the time to a target validation loss and, on a GPU, its utilisation (NVML).
Each configuration trains for --seconds after --warmup steps; --repeats runs the whole grid
again in the same order (single and ensemble, eager and graphed interleaved), and rates are
medians over the repeats. Prints a table on stderr and one JSON object on stdout (and
--json). The defaults run in one to two minutes on a 2-core CPU; scripts/gpu_check.sh runs
it with GPU-sized settings (toolkit.measure.gpu).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from toolkit.bench.quant_data import BookSpec, Windows, make_windows
from toolkit.bench.quant_models import FAMILIES, SIZES, build, num_params
from toolkit.bench.quant_step import Budget, Outcome, run_eager, run_graphed, sampler, trainee
from toolkit.config.precision import PrecisionConfig
from toolkit.distributed.step_overhead import set_matmul_precision

MODES = ("eager", "graphed")


def positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text}: must be > 0")
        return value

    parse.__name__ = kind.__name__
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toolkit bench quant", description=__doc__.split("\n\n")[1])
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    p.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    p.add_argument("--ensemble", type=positive(int), default=4, help="members K (1: none)")
    p.add_argument("--batch", type=positive(int), default=128, help="windows per step")
    p.add_argument("--lookback", type=positive(int), default=32)
    p.add_argument("--levels", type=positive(int), default=10, help="book levels a side")
    p.add_argument("--train-samples", type=positive(int), default=20_000)
    p.add_argument("--val-samples", type=positive(int), default=512)
    p.add_argument("--seconds", type=positive(float), default=2.0, help="training per run")
    p.add_argument("--warmup", type=int, default=2, help="steps before timing")
    p.add_argument("--eval-every", type=positive(int), default=20, help="steps")
    p.add_argument("--eval-every-s", type=positive(float), default=0.5, help="or seconds")
    p.add_argument("--max-steps", type=positive(int), default=1_000_000)
    p.add_argument(
        "--target-loss",
        type=positive(float),
        default=0.7,
        help="validation MSE to reach (predicting 0 scores about 1)",
    )
    p.add_argument("--lr", type=positive(float), default=1e-3)
    p.add_argument(
        "--fused",
        choices=("auto", "on", "off"),
        default="auto",
        help="AdamW's kernels, as optim.fused",
    )
    p.add_argument(
        "--graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="the whole step as a CUDA graph (auto: eager and graphed on CUDA)",
    )
    p.add_argument(
        "--tf32",
        choices=("on", "off"),
        default="on",
        help="fp32 matmuls on TF32 (Ampere and newer), as precision.tf32",
    )
    p.add_argument("--repeats", type=positive(int), default=1)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (0: torch's default); one keeps a shared VM's figures steady",
    )
    p.add_argument("--json", type=Path, default=None)
    return p


def modes_for(graphs: str, device: torch.device) -> tuple[str, ...] | str:
    """The modes to run, or why the request cannot run here."""
    if device.type != "cuda":
        if graphs == "on":
            return "--graphs on: CUDA graphs need a CUDA device (this is a CPU)"
        return ("eager",)
    return {"auto": MODES, "on": ("graphed",), "off": ("eager",)}[graphs]


def run_config(
    key: tuple[str, str, int, str],
    args: argparse.Namespace,
    windows: Windows,
    budget: Budget,
    device: torch.device,
) -> Outcome | str:
    """Train one configuration (family, size, members, mode) from its start; its outcome,
    or what failed in one line (the other configurations still run)."""
    family, size, members, mode = key

    def make() -> torch.nn.Module:
        return build(family, size, windows.features.shape[1], windows.lookback)

    try:
        t = trainee(make, members, device, args.lr, args.fused, capturable=mode == "graphed")
        draw = sampler(windows, args.batch, args.seed)
        run = run_graphed if mode == "graphed" else run_eager
        return run(t, draw, windows, budget, device)
    except Exception as exc:  # noqa: BLE001 - reported in the configuration's row
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first}"


def row(
    family: str,
    size: str,
    members: int,
    mode: str,
    batch: int,
    params: int,
    outcomes: list[Outcome | str],
) -> dict[str, Any]:
    """One configuration's figures: rates are medians over the repeats, the rest from the
    median run; a failed run makes the row its error."""
    failed = [o for o in outcomes if isinstance(o, str)]
    if failed:
        return {"family": family, "size": size, "params": params, "members": members,
                "mode": mode, "error": failed[0]}  # fmt: skip
    runs = [o for o in outcomes if isinstance(o, Outcome)]
    rates = [o.steps * batch / o.train_s for o in runs]
    median_run = sorted(runs, key=lambda o: o.steps * batch / o.train_s)[len(runs) // 2]
    o = median_run
    per_step = {k: 1000 * v / o.steps for k, v in o.split_s.items()}
    return {
        "family": family,
        "size": size,
        "params": params,
        "members": members,
        "mode": mode,
        "batch": batch,
        "steps": o.steps,
        "samples_per_s": statistics.median(rates),
        "samples_per_s_runs": rates,
        "model_samples_per_s": statistics.median(rates) * members,
        "step_ms": 1000 * o.train_s / o.steps,
        "split_ms": per_step,
        "data_wait_share": o.data_wait_s / o.train_s,
        "time_to_target_s": o.time_to_target_s,
        "final_val_loss": o.val_curve[-1][1] if o.val_curve else None,
        "best_val_loss": min(v for _, v in o.val_curve) if o.val_curve else None,
        "gpu_util_pct": o.gpu_util_pct,
        "gpu_util_why": o.gpu_util_why,
        "notes": o.notes,
    }


def speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family, size and mode: the ensemble's model-samples/s over one model's samples/s
    (K members in one step against K separate steps); per family, size and members: graphed
    over eager samples/s."""
    by = {(r["family"], r["size"], r["members"], r["mode"]): r for r in rows if "error" not in r}
    out = []
    for (family, size, members, mode), r in by.items():
        single = by.get((family, size, 1, mode))
        if members > 1 and single is not None:
            out.append(
                {
                    "family": family,
                    "size": size,
                    "mode": mode,
                    "ensemble_vs_separate": r["model_samples_per_s"] / single["samples_per_s"],
                    "members": members,
                }
            )
        eager = by.get((family, size, members, "eager"))
        if mode == "graphed" and eager is not None:
            out.append(
                {
                    "family": family,
                    "size": size,
                    "members": members,
                    "graphed_vs_eager": r["samples_per_s"] / eager["samples_per_s"],
                }
            )
    return out


def table(result: dict[str, Any]):
    from rich.table import Table

    t = Table(title=f"bench quant: {result['device']} (target val loss {result['target_loss']})")
    for name in (
        "model",
        "K",
        "mode",
        "samples/s",
        "model-samples/s",
        "step ms",
        "data / fwd-bwd / optim ms",
        "data wait",
        "to target",
        "val loss",
        "GPU util",
    ):
        t.add_column(name, justify="left" if name in ("model", "mode") else "right")
    for r in result["results"]:
        model = f"{r['family']} {r['size']} ({r['params'] / 1e3:,.0f}k)"
        if "error" in r:
            t.add_row(model, str(r["members"]), r["mode"], "FAILED", r["error"])
            continue
        split = " / ".join(f"{v:.2f}" for v in r["split_ms"].values())
        t.add_row(
            model,
            str(r["members"]),
            r["mode"],
            f"{r['samples_per_s']:,.0f}",
            f"{r['model_samples_per_s']:,.0f}",
            f"{r['step_ms']:.2f}",
            split,
            f"{100 * r['data_wait_share']:.1f}%",
            "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s",
            f"{r['best_val_loss']:.3f}" if r["best_val_loss"] is not None else "-",
            "-" if r["gpu_util_pct"] is None else f"{r['gpu_util_pct']:.0f}%",
        )
    return t


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    want = (
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if want == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device visible", file=sys.stderr)
        return 2
    device = torch.device(want, 0) if want == "cuda" else torch.device("cpu")
    modes = modes_for(args.graphs, device)
    if isinstance(modes, str):
        print(f"error: {modes}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        result = run(args, device, modes)
    finally:
        torch.set_num_threads(threads)  # as it was: main may run inside another program
    result["command"] = "toolkit bench quant " + shlex.join(sys.argv[1:] if argv is None else argv)
    from rich.console import Console

    Console(file=sys.stderr, width=200).print(table(result))
    from toolkit.measure.results import print_json

    print_json(result, args.json)
    return 0


def run(args: argparse.Namespace, device: torch.device, modes: tuple[str, ...]) -> dict[str, Any]:
    """The grid of configurations, --repeats times over, and the result's JSON object."""
    tf32 = set_matmul_precision(PrecisionConfig(tf32=args.tf32 == "on"), device)
    spec = BookSpec(
        levels=args.levels,
        lookback=args.lookback,
        train_samples=args.train_samples,
        val_samples=args.val_samples,
        seed=args.seed,
    )
    windows = make_windows(spec, device)
    budget = Budget(
        args.seconds,
        args.warmup,
        args.max_steps,
        args.eval_every,
        args.eval_every_s,
        args.target_loss,
    )
    memberships = [0] if args.ensemble == 1 else [0, args.ensemble]
    grid = [
        (f, s, k, m) for f in args.families for s in args.sizes for k in memberships for m in modes
    ]
    outcomes: dict[tuple, list[Outcome | str]] = {key: [] for key in grid}
    for _ in range(args.repeats):  # the whole grid again: configurations interleave
        for key in grid:
            outcomes[key].append(run_config(key, args, windows, budget, device))
            if device.type == "cuda":  # what the configuration reserved, its graph's pool too
                torch.cuda.empty_cache()
    rows = [
        row(
            f,
            s,
            max(1, k),
            m,
            args.batch,
            num_params(build(f, s, spec.width, spec.lookback)),
            outcomes[(f, s, k, m)],
        )  # fmt: skip
        for f, s, k, m in grid
    ]
    val_y = windows.val()[1]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
        "data": {**vars(spec), "width": spec.width, "batch": args.batch},
        "target_loss": args.target_loss,
        "zero_prediction_val_loss": float(val_y.square().mean()),
        "seconds_per_run": args.seconds,
        "repeats": args.repeats,
        "fused": args.fused,
        "tf32": tf32,
        "results": rows,
        "speedups": speedups(rows),
    }
    return result


if __name__ == "__main__":
    sys.exit(main())
