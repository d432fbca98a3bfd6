"""`python -m toolkit.bench.overhead [--reps R] [--steps N] [--warmup W] [--world K] [OVERRIDE ...]`

How much does the toolkit's training step cost over a bare, hand-written FSDP2 loop?

Both run in the same K processes (gloo on CPU, NCCL on GPU), on the same model class,
shapes, batches, precision and world size, interleaved for R repetitions (A B, B A, A B, ...):

* A, toolkit: `toolkit.tasks.train.build_trainer(job, ...)` and `Trainer.fit()` (data loader
  with prefetch thread, metrics sinks, scheduler, loss all-reduce, hooks: everything).
* B, bare (`bare_loop` below): fully_shard per block and at the root, AdamW, a loop over
  pre-built batches with forward, backward, grad-norm clipping, step, zero_grad and
  loss.item(). No toolkit code runs inside its loop.

Each repetition builds both from scratch (build time not measured), skips W warm-up steps
and times N steps on rank 0 (perf_counter between step ends). The reported figure is the
median over repetitions of toolkit_step_s / bare_step_s (each the median step time
of its repetition) (target <= 1.02). The same ratio in CPU time of rank 0's process
(all threads: the toolkit's prefetch thread counts) is reported beside it: on a machine
shared with other work, wall time swings with the neighbours' load while CPU time per step
does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from toolkit.config.job import JobConfig
from toolkit.hooks import Hook

DEFAULTS = [
    "model=gpt_small",
    "data.seq_len=128",
    "trainer.micro_batch_size=8",
    "trainer.progress=false",
    "trainer.log_every=1000000",
    "trainer.eval_batches=0",
]


# -- B: the baseline, written the way one would by hand ------------------------------------
def now() -> tuple[float, float]:
    """(wall clock, CPU time of this process: all its threads)."""
    return time.perf_counter(), time.process_time()


def bare_loop(
    job: JobConfig,
    batches: list[list[tuple[torch.Tensor, torch.Tensor]]],
    device: torch.device,
) -> list[tuple[float, float]]:
    """Train on `batches` (one list of micro-batches per step); now() at each step end."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from toolkit.train.models import build_model  # the model class, not the loop

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    torch.manual_seed(job.seed)
    model = build_model(job.model)
    model.reset_parameters()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp_policy = MixedPrecisionPolicy(
        param_dtype=dtypes[job.precision.param_dtype],
        reduce_dtype=dtypes[job.precision.reduce_dtype],
    )
    for i, block in enumerate(model.blocks):
        fully_shard(
            block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=i < len(model.blocks) - 1
        )
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    model.to(device)
    o = job.optim
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        foreach=True,
    )
    accum = len(batches[0])
    ends = [now()]
    for micro_batches in batches:
        for inputs, targets in micro_batches:
            loss = model(inputs.to(device), targets.to(device)) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        ends.append(now())
    return ends


# -- A: the toolkit ------------------------------------------------------------------------
class StepClock(Hook):
    """Loop hook: now() when fit starts and at the end of every step."""

    def __init__(self) -> None:
        self.ends: list[tuple[float, float]] = []

    def on_start(self, trainer: Any) -> None:
        self.ends.append(now())

    def after_step(self, trainer: Any, record: Any, votes: list[float]) -> None:
        self.ends.append(now())


def toolkit_loop(
    job: JobConfig, env: Any, run_dir: Path, device: torch.device
) -> list[tuple[float, float]]:
    from toolkit.tasks.train import build_trainer

    trainer = build_trainer(job, env, run_dir, device)
    clock = StepClock()
    trainer.hooks.append(clock)
    try:
        trainer.fit()
    finally:
        trainer.sink.close()
    return clock.ends


def step_seconds(ends: list[float], warmup: int) -> float:
    """Median seconds per step after the warm-up, from step-end timestamps (ends[0]: the
    start). The median, not the mean: on a shared machine single steps stall for whole
    scheduler slices, and those stalls land on A or B by chance."""
    durations = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    return statistics.median(durations[warmup:])


def worker(rank: int, world: int, job: JobConfig, args: dict, out: str) -> None:
    from toolkit.distributed.env import discover
    from toolkit.distributed.init import init_distributed, shutdown_distributed
    from toolkit.train.data import BatchPlan, open_sources

    env = discover()  # rank `rank` of `world` (toolkit.bench.ranks)
    device = init_distributed(env, 300.0)
    steps = args["warmup"] + args["steps"]
    plan = BatchPlan(
        job.seed,
        job.data.seq_len,
        job.trainer.micro_batch_size,
        job.trainer.grad_accum,
        world,
        rank,
    )
    source = open_sources(job.data, job.model.vocab_size, job.model.num_series)["train"]
    batches = [plan.micro_batches(source, "train", s) for s in range(steps)]  # same data as A
    rows = []
    try:
        for rep in range(args["reps"]):
            run_dir = Path(out) / f"rep{rep}"
            dist.barrier()
            # A B, then B A: a drift within a repetition does not always land on one side.
            if rep % 2 == 0:
                ta = toolkit_loop(job, env, run_dir, device)
                dist.barrier()
                tb = bare_loop(job, batches, device)
            else:
                tb = bare_loop(job, batches, device)
                dist.barrier()
                ta = toolkit_loop(job, env, run_dir, device)
            w = args["warmup"]
            a, b = step_seconds([t[0] for t in ta], w), step_seconds([t[0] for t in tb], w)
            ca, cb = step_seconds([t[1] for t in ta], w), step_seconds([t[1] for t in tb], w)
            rows.append(
                {
                    "rep": rep,
                    "toolkit_step_s": a,
                    "bare_step_s": b,
                    "ratio": a / b,
                    "toolkit_cpu_s": ca,
                    "bare_cpu_s": cb,
                    "cpu_ratio": ca / cb,
                }
            )
            if rank == 0:
                print(
                    f"rep {rep}: wall toolkit {1000 * a:.1f} ms  bare {1000 * b:.1f} ms  "
                    f"ratio {a / b:.3f} | CPU time {1000 * ca:.1f} / {1000 * cb:.1f} ms  "
                    f"ratio {ca / cb:.3f}",
                    flush=True,
                )
    finally:
        shutdown_distributed()
    if rank == 0:
        (Path(out) / "overhead.json").write_text(json.dumps(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m toolkit.bench.overhead")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    problems = [
        f"--{name}={getattr(args, name)}: must be >= {low}"
        for name, low in (("reps", 1), ("steps", 2), ("warmup", 1), ("world", 1))
        if getattr(args, name) < low
    ]
    if problems:
        print("\n".join(f"error: {line}" for line in problems), file=sys.stderr)
        return 2
    from toolkit.bench.ranks import run_ranks
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.config.errors import ConfigError
    from toolkit.train.data import prepare

    user_keys = {o.split("=", 1)[0] for o in args.overrides}
    defaults = [d for d in DEFAULTS if d.split("=", 1)[0] not in user_keys]
    overrides = [*defaults, *args.overrides, f"trainer.steps={args.warmup + args.steps}"]
    try:
        job = to_job(compose_raw(overrides))
    except ConfigError as exc:
        print("\n".join(f"error: {line}" for line in exc.problems), file=sys.stderr)
        return 2
    prepare(job.data, job.model.num_series)
    out = (args.out or Path(tempfile.mkdtemp(prefix="overhead-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = {"reps": args.reps, "steps": args.steps, "warmup": args.warmup}
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_ranks(worker, args.world, out, job, settings, str(out))
    rows = json.loads((out / "overhead.json").read_text())
    ratios = [r["ratio"] for r in rows]
    cpu_ratios = [r["cpu_ratio"] for r in rows]
    result = {
        "median_ratio": statistics.median(ratios),
        "ratio_min_max": [min(ratios), max(ratios)],
        "median_cpu_ratio": statistics.median(cpu_ratios),
        "cpu_ratio_min_max": [min(cpu_ratios), max(cpu_ratios)],
        "toolkit_step_s_median": statistics.median(r["toolkit_step_s"] for r in rows),
        "bare_step_s_median": statistics.median(r["bare_step_s"] for r in rows),
        "reps": rows,
        "world_size": args.world,
        "overrides": overrides,
        "out": str(out),
    }
    (out / "result.json").write_text(json.dumps(result) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
