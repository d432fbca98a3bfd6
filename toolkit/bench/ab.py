"""`python -m toolkit.bench.ab CASE [--reps R] [--steps N] [--warmup W] [--world K]
[--variants GLOB,...] [--variant NAME=OVERRIDE,...] [--out DIR] [OVERRIDE ...]`

One A/B harness: a case is a set of variants, each an override list on one job, and a
baseline named in code (`Case.baseline`). Every variant trains the same job from scratch in
fresh processes, R interleaved repetitions (A B C, B C A, C A B, ...: a drift of the machine
lands on each variant in turn); a run's figure is the median seconds per step after W warm-up
steps (the median: on a shared machine single steps stall for whole scheduler slices). The
result per variant: the median over repetitions, and the median of the per-repetition
ratios to the baseline (min-max beside it), in wall time and, with the `ranks` runner, in
CPU time of rank 0's process (all threads), which swings less with the neighbours' load.
Beside the step time: peak memory, final loss and the divergence of its per-step loss from
the baseline's (max and final |delta loss|: the same seed and data), and, with the `ranks`
runner, the optimizer state bytes per parameter (the real tensors).

Two runners, one per process boundary the case measures:
* `ranks`: K processes on this machine (`toolkit.bench.ranks`), each building the toolkit's
  trainer (`toolkit.tasks.train.build_trainer`) and timing `fit()` with a step hook; the
  variant named `bare` is the hand-written FSDP2 loop (`toolkit.bench.bare`) on the same
  batches.
* `launch`: the real CLI (`python -m toolkit.launch`), timed from the run's step records:
  for what starts with the launcher (the telemetry agent, the trackers).

A variant that does not compose (an option missing on this branch) is listed with the reason
and not run. Out: DIR/ab.json (every run) and the summary on stdout as JSON.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TINY = ["model=gpt_tiny", "data.seq_len=64"]
QUIET = ["trainer.progress=false", "trainer.log_every=1000000", "trainer.eval_batches=0"]
# A step long enough to time on 2 CPU ranks (gpt_small), as in the figures of docs/BENCHMARKS.md.
SMALL = ["model=gpt_small", "data.seq_len=128", "trainer.micro_batch_size=8", *QUIET]
NO_SAVE = ["checkpoint.interval_steps=0", "checkpoint.save_final=false", "checkpoint.resume=false"]


@dataclass(frozen=True)
class Case:
    about: str
    variants: dict[str, list[str]]
    baseline: str
    runner: str = "ranks"  # or "launch"
    common: list[str] = field(default_factory=list)
    world: int = 2


def tradeoff_matrix() -> dict[str, list[str]]:
    """precision x activation checkpointing x kernels x optimizer, named like
    `bf16-ac-liger-adamw8bit`; the fp32 reference first."""
    out = {}
    for prec, ac, kern, opt in itertools.product(
        ("fp32", "bf16"), ("noac", "ac"), ("torch", "liger"), ("adamw", "adamw8bit")
    ):
        out[f"{prec}-{ac}-{kern}-{opt}"] = [
            f"precision={prec}",
            f"parallel.activation_checkpointing={str(ac == 'ac').lower()}",
            f"model.kernels={kern}",
            f"optim={opt}",
        ]
    return out


def pipeline_layout(pp: int, dp_shard: int, schedule: str, virtual: int) -> list[str]:
    return [
        f"parallel.pp={pp}",
        f"parallel.dp_shard={dp_shard}",
        f"parallel.pp_schedule={schedule}",
        f"parallel.pp_virtual_stages={virtual}",
    ]


CASES = {
    "overhead": Case(
        "the toolkit's step (checkpoint and preemption hooks armed, no save timed; and without "
        "checkpointing) against a bare, hand-written FSDP2 loop",
        {"bare": [], "toolkit": NO_SAVE, "no_ckpt": ["checkpoint.enabled=false"]},
        baseline="bare",
        common=SMALL,
    ),
    "watchdog": Case(
        "the hang watchdog (a heartbeat at every phase and collective) on against off",
        {"off": ["fault.hang_watchdog=false"], "on": ["fault.hang_watchdog=true"]},
        baseline="off",
        common=[*SMALL, "checkpoint.enabled=false"],
    ),
    "deterministic": Case(
        "trainer.deterministic (torch's deterministic algorithms, the cuBLAS workspace, "
        "NCCL_ALGO=Ring and NCCL_PROTO=Simple; set by the rank's entrypoint: real launcher) "
        "on against off",
        {"off": [], "on": ["trainer.deterministic=true"]},
        baseline="off",
        runner="launch",
        common=[*SMALL, "checkpoint.enabled=false", "telemetry=off"],
    ),
    "lowbit": Case(
        "optimizer state bytes per parameter and step time, adamw against the low-bit states",
        {name: [f"optim={name}"] for name in ("adamw", "adamw8bit", "adamw_lowmem")},
        baseline="adamw",
        common=[*SMALL, "checkpoint.enabled=false"],
        world=1,
    ),
    "pipeline": Case(
        "pipeline layouts on 4 ranks against data parallelism alone (step time, peak memory)",
        {
            "dp4": pipeline_layout(1, 4, "1f1b", 1),
            "pp2_dp2_1f1b": pipeline_layout(2, 2, "1f1b", 1),
            "pp2_dp2_gpipe": pipeline_layout(2, 2, "gpipe", 1),
            "pp2_dp2_interleaved": pipeline_layout(2, 2, "interleaved_1f1b", 2),
        },
        baseline="dp4",
        common=[*SMALL, "checkpoint.enabled=false", "trainer.grad_accum=4"],
        world=4,
    ),
    "telemetry": Case(
        "step time with telemetry (the node agent, real launcher) on against off",
        {
            "off": ["telemetry=off"],
            "on_1s": ["telemetry.interval_s=1.0"],
            "on_0.1s": ["telemetry.interval_s=0.1"],
        },
        baseline="off",
        runner="launch",
        common=[*TINY, *QUIET],
    ),
    "profiling": Case(
        "the profiler configured (no window open) and the communication timer, against neither",
        {
            "not_configured": ["telemetry.profile_on_demand=false", "telemetry.comm_timing=false"],
            "profiler_idle": [
                "telemetry.profile_steps=[100000,100001]",
                "telemetry.comm_timing=false",
            ],
            "profiler_idle+comm_timing": ["telemetry.profile_steps=[100000,100001]"],
        },
        baseline="not_configured",
        runner="launch",
        common=[*TINY, *QUIET, "telemetry=off"],
    ),
    "tracking": Case(
        "TensorBoard + MLflow + W&B (offline) on against tracking=none (time the second half "
        "of the run: --warmup = --steps)",
        {"none": ["tracking=none"], "all": ["tracking=[tensorboard,mlflow,wandb]"]},
        baseline="none",
        runner="launch",
        common=[*TINY, *QUIET, "telemetry=off"],
    ),
    "tradeoffs": Case(
        "the trade-off matrix (precision x AC x kernels x optimizer), the same tokens, against "
        "the fp32 reference",
        tradeoff_matrix(),
        baseline="fp32-noac-torch-adamw",
        runner="launch",
        common=[*TINY, *QUIET, "telemetry=off", "cluster.tasks_per_node=1"],
    ),
}


def interleaved(names: list[str], reps: int) -> list[list[str]]:
    """The order of each repetition: rotated by one each time."""
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(reps)]


def step_seconds(ends: list[float], warmup: int) -> float:
    """Median seconds per step after the warm-up, from step-end timestamps (ends[0]: the start)."""
    durations = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    return statistics.median(durations[warmup:])


def divergence(curve: list[float], reference: list[float]) -> dict[str, float]:
    """Max and final |delta loss| of a per-step loss curve from the baseline's."""
    deltas = [abs(a - b) for a, b in zip(curve, reference, strict=True)]
    return {"max_abs_delta_loss": max(deltas), "final_abs_delta_loss": deltas[-1]}


def merged(common: list[str], variant: list[str], user: list[str]) -> list[str]:
    """The case's overrides, the variant's, then the user's; a common one the user sets is
    dropped, and the case's model preset when the user names their own model
    (`model._target_=...`, `model.kind=NAME`)."""
    keys = {o.lstrip("+").split("=", 1)[0] for o in user}
    keys |= {k.split(".")[0] for k in keys if k.endswith(("._target_", ".kind"))}
    return [*(o for o in common if o.split("=", 1)[0] not in keys), *variant, *user]


def compose(overrides: list[str]) -> tuple[Any, str]:
    """(the job, "") or (None, why it does not compose or validate: one line)."""
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.config.errors import ConfigError
    from toolkit.config.validate import validate

    try:
        job = to_job(compose_raw(overrides))
        validate(job)
    except ConfigError as exc:
        return None, "; ".join(exc.problems)
    return job, ""


def ranks_run(job: Any, bare: bool, world: int, warmup: int, out: Path) -> dict[str, Any]:
    from toolkit.bench.bare import run_worker
    from toolkit.bench.ranks import run_ranks
    from toolkit.config.model import series_shape
    from toolkit.data.files import prepare

    prepare(job.data, *series_shape(job.model))
    out.mkdir(parents=True)
    run_ranks(run_worker, world, out, job, bare, str(out))
    run = json.loads((out / "run.json").read_text())
    ends = run.pop("ends")
    run["step_s"] = step_seconds([wall for wall, _ in ends], warmup)
    run["cpu_s"] = step_seconds([cpu for _, cpu in ends], warmup)
    return run


def launch_run(overrides: list[str], warmup: int, out: Path) -> dict[str, Any]:
    from toolkit.events import read_steps

    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "toolkit.launch", *overrides, f"hydra.run.dir={out}"]
    env = dict(os.environ, PYTHONPATH=str(repo))
    subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True, timeout=900)
    steps = read_steps(out / "metrics" / "rank0.jsonl")
    return {
        "step_s": statistics.median(s["step_time_s"] for s in steps[warmup:]),
        "losses": [s["loss"] for s in steps],
        "peak_memory_bytes": max(s["mem_peak_bytes"] for s in steps),
    }


def summarise(runs: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, Any]:
    """Per variant: medians over repetitions and the median of per-repetition ratios to the
    baseline (repetition r of a variant against repetition r of the baseline)."""
    out = {}
    base = runs[baseline]
    for name, rows in runs.items():
        row: dict[str, Any] = {"runs": len(rows)}
        for key in ("step_s", "cpu_s", "peak_memory_bytes", "state_bytes_per_param"):
            if key in rows[0]:
                row[f"{key}_median"] = statistics.median(r[key] for r in rows)
        for key in ("step_s", "cpu_s"):
            if key in rows[0]:
                ratios = [r[key] / b[key] for r, b in zip(rows, base, strict=True)]
                row[f"{key}_ratio"] = statistics.median(ratios)
                row[f"{key}_ratio_min_max"] = [min(ratios), max(ratios)]
        if "losses" in rows[0]:  # the bare loop keeps none (no all-reduce of its loss)
            row["final_loss"] = rows[0]["losses"][-1]
            row["bitwise_reproducible"] = all(r["losses"] == rows[0]["losses"] for r in rows)
            if "losses" in base[0]:
                row.update(divergence(rows[0]["losses"], base[0]["losses"]))
        out[name] = row
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m toolkit.bench.ab")
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--world", type=int, default=None, help="ranks (default: the case's)")
    p.add_argument("--variants", default="*", help="comma-separated globs; the baseline runs")
    p.add_argument("--variant", action="append", default=[], help="NAME=OVERRIDE,OVERRIDE")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    return p.parse_intermixed_args(argv)


def variants_of(case: Case, args: argparse.Namespace) -> tuple[dict[str, list[str]], list[str]]:
    """(the variants to run, the baseline first; one-line problems with the arguments)."""
    problems = [
        f"--{k}={getattr(args, k)}: must be >= {low}"
        for k, low in (("reps", 1), ("steps", 1), ("warmup", 0))
        if getattr(args, k) < low
    ]
    extra = dict(v.split("=", 1) for v in args.variant if "=" in v)
    problems += [f"--variant={v}: must be NAME=OVERRIDE,..." for v in args.variant if "=" not in v]
    every = {**case.variants, **{k: v.split(",") for k, v in extra.items()}}
    globs = args.variants.split(",")
    chosen = [n for n in every if n in extra or any(fnmatch.fnmatch(n, g) for g in globs)]
    if not [n for n in chosen if n != case.baseline]:
        problems.append(f"--variants={args.variants}: matches none but the baseline")
    names = [case.baseline, *(n for n in chosen if n != case.baseline)]
    return {n: every[n] for n in names}, problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    case = CASES[args.case]
    variants, problems = variants_of(case, args)
    if problems:
        print("\n".join(f"error: {line}" for line in problems), file=sys.stderr)
        return 2
    world = args.world or case.world
    out = (args.out or Path(tempfile.mkdtemp(prefix=f"ab-{args.case}-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    length = [f"trainer.steps={args.warmup + args.steps}"]
    jobs, unavailable = {}, {}
    full = {n: [*merged(case.common, v, args.overrides), *length] for n, v in variants.items()}
    for name in variants:
        jobs[name], why = compose(full[name])
        if why:
            unavailable[name] = why
            print(f"{name}: unavailable: {why}", flush=True)
    if case.baseline in unavailable:
        print(f"error: the baseline {case.baseline}: {unavailable[case.baseline]}", file=sys.stderr)
        return 2
    names = [n for n in variants if n not in unavailable]
    print(f"{args.case}: {case.about}; baseline {case.baseline}; load {os.getloadavg()[0]:.1f}")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rep, order in enumerate(interleaved(names, args.reps)):
        for name in order:
            run_dir = out / f"rep{rep}-{name}"
            if case.runner == "ranks":
                run = ranks_run(jobs[name], name == "bare", world, args.warmup, run_dir)
            else:
                run = launch_run(full[name], args.warmup, run_dir)
            runs[name].append({"rep": rep, "order": order, **run})
            print(f"rep {rep} {name:24} {1000 * run['step_s']:8.2f} ms/step", flush=True)
    result = {
        "case": args.case,
        "baseline": case.baseline,
        "world_size": world if case.runner == "ranks" else None,
        "variants": summarise(runs, case.baseline),
        "unavailable": unavailable,
        "overrides": full,
        "load_average": os.getloadavg()[0],
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (out / "ab.json").write_text(json.dumps({**result, "runs": runs}) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
