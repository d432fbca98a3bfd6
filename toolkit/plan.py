"""`python -m toolkit.plan [--top K] [--cost PRICES.yaml --tokens N|--samples N] [--check K] [OVERRIDE ...]`:
recommend a layout for a fixed global batch, and its cost.

Enumerates the layouts the toolkit runs for the configured model, hardware, cluster and
global batch (tensor-parallel degree inside a node, pipeline stages and schedule, FSDP or
HSDP replicate sizes, micro-batch x accumulation, activation checkpointing,
reshard_after_forward, with accumulation the gradient sync per micro-step
`trainer.grad_sync=last|every` and `trainer.reshard_between_micro_steps`, and on GPUs the
memory options: the fused linear cross-entropy
`model.kernels=liger` where tp == 1 and 8-bit optimizer states `optim=adamw8bit`, each only
where its code is installed), drops those the performance model says do not fit, ranks the
rest by predicted tokens/s and prints the top K with the dominant term and the overrides that
run each. The memory options only change memory in the model, so they lead only where memory
binds (they let a faster layout fit); on a tie the default comes first.

--cost PRICES.yaml (a mapping hardware preset -> price per device-hour, written by the user;
no price is built in) prints the time and cost to train --tokens N tokens (a samples model:
--samples N samples; default 1e9 either way) with the best layout on every priced preset, the
cheapest first. --check K [--spread] runs K plans locally for a
few steps through the training benchmark (toolkit.measure.plan_check) and prints predicted vs
measured and whether the predicted order holds. The ranking itself is
toolkit.perfmodel.planner; this module is its command line.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and any(a.split("=")[0] == "--run" for a in sys.argv[1:]):
    from toolkit.readonly import drop_working_dir

    drop_working_dir()  # a run dir is read as data: none of its code is imported

import argparse  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

from toolkit.config.shape import world_size  # noqa: E402
from toolkit.perfmodel.count_job import predicted_rate  # noqa: E402
from toolkit.perfmodel.planner import (  # noqa: E402
    Plan,
    Planning,
    base_layout,
    batch_line,
    cost_rows,
    job_global_batch,
    memory_options,
    plan_job,
    rank_plans,
    shape_name,
    spread,
)
from toolkit.perfmodel.regime import add_bench_data_option, read_bench_data, regime  # noqa: E402


def print_plans(
    plans: list[Plan], dropped: int, top: int, title: str, model=None, seq_len: int = 1
) -> None:
    """The top plans; the rate in the model's unit (tokens/s, or samples/s for a samples
    model: `model` is the planned model, `seq_len` its tokens per sequence)."""
    from rich.console import Console
    from rich.table import Table

    unit = predicted_rate(plans[0].prediction, model, seq_len)[0] if plans and model else "tokens"
    table = Table(title=f"{title}: {len(plans)} layouts fit, {dropped} do not")
    for col in ("#", f"{unit}/s", "range", "step", "dominant", "peak mem/rank", "overrides"):
        table.add_column(col)
    for i, p in enumerate(plans[:top], 1):
        pr = p.prediction
        rate = predicted_rate(pr, model, seq_len)[1] if model else pr.tokens_per_s
        per_step = rate * pr.step_s
        table.add_row(
            str(i),
            f"{rate:,.0f}",
            " – ".join(f"{per_step / s:,.0f}" for s in reversed(pr.step_range_s())),
            f"{pr.step_s * 1000:,.1f} ms",
            pr.dominant,
            f"{pr.memory['peak_bytes'] / 2**30:,.2f} GiB",
            " ".join(p.overrides()),
        )
    Console(width=220).print(table)


def plan_run(run_dir: Path) -> Planning | None:
    """The layouts for a run as it ran: its config.yaml read as plain values and its model
    from the RUN/model.json it recorded (nothing it names is imported or built); None after
    one `error:` line."""
    from toolkit.config.compose import load_job
    from toolkit.config.model import TransformerConfig
    from toolkit.perfmodel.count_job import shape_of_run_model
    from toolkit.runmodel import run_model_or_note

    try:
        job = load_job(run_dir / "config.yaml")
    except Exception as exc:  # noqa: BLE001 - YAML, OmegaConf and schema errors alike
        print(
            f"error: {run_dir / 'config.yaml'}: unreadable ({type(exc).__name__})", file=sys.stderr
        )
        return None
    model = job.model
    if not isinstance(model, TransformerConfig):
        recorded, why = run_model_or_note(run_dir)
        if recorded is None:
            print(f"error: {run_dir}: {why}", file=sys.stderr)
            return None
        model = shape_of_run_model(recorded)
    base = base_layout(job)
    batch = job_global_batch(job, world_size(job.cluster))
    kernels, optimizers, skipped = memory_options(job)
    plans, dropped = rank_plans(model, base, job.hardware, batch, kernels, optimizers)
    return Planning(job, [], [], model, base, batch, kernels, optimizers, skipped, plans, dropped)


def main(argv: list[str] | None = None) -> int:
    """The planner's command line."""
    from toolkit.config.sources import add_config_dir_option

    parser = argparse.ArgumentParser(prog="python -m toolkit.plan")
    add_config_dir_option(parser)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--cost", type=Path, default=None, help="YAML: preset -> $/device-hour")
    parser.add_argument("--tokens", type=float, default=None, help="tokens to train (--cost)")
    parser.add_argument(
        "--samples", type=float, default=None, help="samples to train (--cost, a samples model)"
    )
    parser.add_argument("--check", type=int, default=0, help="run the top K plans locally")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per --check run")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="--check K runs K plans spread over the ranking (best, worst, between), not the top K",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per sequence to plan for (default: data.seq_len= if given, else the "
        "model's max_seq_len)",
    )
    parser.add_argument(
        "--run", type=Path, default=None, metavar="RUN_DIR", help="plan a run as it ran"
    )
    add_bench_data_option(parser)  # the small-model regime's data paths
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    from toolkit.config.compose import compose_raw, to_job

    if args.seq_len is not None and args.seq_len < 1:
        print(f"error: --seq-len={args.seq_len}: must be >= 1", file=sys.stderr)
        return 2
    if args.run is not None and (args.overrides or args.config_dir or args.check or args.seq_len):
        print(
            "error: --run RUN_DIR: plans the run as it ran; no overrides, -cd, --seq-len or --check",
            file=sys.stderr,
        )
        return 2
    if args.run is not None:
        planning = plan_run(args.run)
    else:
        planning = plan_job(args.overrides, args.config_dir, args.seq_len)
    if planning is None:
        return 2
    job, overrides, base, batch = planning.job, planning.overrides, planning.base, planning.batch
    plans = planning.plans
    samples = bool(plans) and predicted_rate(plans[0].prediction, planning.model, 1)[0] == "samples"
    per_step = f"{batch} samples" if samples else f"{batch} x {base.seq_len} tokens"
    title = (
        f"{shape_name(job, overrides)} on {base.world_size} x {job.hardware.name}, "
        f"{job.precision.name}, global batch {per_step}"
    )
    for line in planning.defaults:
        print(line)
    if samples:  # a samples model: its rate and batch in samples
        print(f"planned for a global batch of {batch} samples")
    else:
        print(batch_line(job, world_size(job.cluster), batch, base.seq_len))
    print_plans(plans, planning.dropped, args.top, title, planning.model, base.seq_len)
    for line in planning.skipped:
        print(line)
    if not plans:
        print("no layout fits in memory")
    try:  # the best layout's launch floor, packing, data paths and advice
        rates = read_bench_data(args.bench_data)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    packable = [p.layout for p in plans if p.layout.tp == p.layout.pp == 1]  # an ensemble's
    small = regime(job, None, planning.model, rates, packable[0]) if packable else None
    for line in small.lines if small else []:
        print(line)
    if args.cost is not None:
        from toolkit.perfmodel.prices import read_prices

        unit, wrong = ("samples", "tokens") if samples else ("tokens", "samples")
        if getattr(args, wrong) is not None:
            print(f"error: --{wrong}: this model counts {unit}; give --{unit} N", file=sys.stderr)
            return 2
        amount = getattr(args, unit) or 1e9

        try:
            price_table = read_prices(args.cost)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        presets = {
            n: to_job(compose_raw([*overrides, f"hardware={n}"], args.config_dir)).hardware
            for n in price_table
        }
        rows = cost_rows(
            planning.model,
            base,
            batch,
            presets,
            price_table,
            amount,
            planning.kernels,
            planning.optimizers,
        )
        print(f"cost to train {amount:.3g} {unit} on {base.world_size} devices:")
        for r in rows:
            if not r["fits"]:
                print(f"  {r['hardware']}: no layout fits")
                continue
            print(
                f"  {r['hardware']}: {r[f'{unit}_per_s']:,.0f} {unit}/s, {r['hours']:,.1f} h, "
                f"{r['device_hours']:,.0f} device-h, cost {r['cost']:,.0f} "
                f"({' '.join(r['overrides'])})"  # type: ignore[arg-type]
            )
    if args.check:
        chosen = spread(plans, args.check) if args.spread else plans[: args.check]
        # The checked runs compose the job themselves: the -cd directories reach them (and
        # their ranks) first on $TOOLKIT_CONFIG_PATH, in the same order of search.
        if args.config_dir:
            searched = [*args.config_dir, os.environ.get("TOOLKIT_CONFIG_PATH", "")]
            os.environ["TOOLKIT_CONFIG_PATH"] = ":".join(d for d in searched if d)
        from toolkit.measure import plan_check

        return plan_check.check(chosen, overrides, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
