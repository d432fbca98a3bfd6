"""`python -m toolkit.bench.overhead [--reps R] [--steps N] [--warmup W] [--world K] [OVERRIDE ...]`

How much does the toolkit's training step cost over a bare, hand-written FSDP2 loop?

Both run in the same K processes (gloo on CPU, NCCL on GPU), on the same model class,
shapes, batches, precision and world size, interleaved for R repetitions (A B, B A, A B, ...):

* A, toolkit: `toolkit.tasks.train.build_trainer(job, ...)` and `Trainer.fit()` (data loader
  with prefetch thread, metrics sinks, scheduler, loss all-reduce, hooks: everything), with
  checkpointing armed as on a Slurm run (its hook and the preemption hook vote every step,
  save-now watched), but no save in the timed steps (checkpoint.interval_steps=0,
  save_final=false).
* A0, toolkit without checkpointing: the same, checkpoint.enabled=false; A / A0 is what the
  checkpoint and preemption hooks cost a step.
* B, bare (`bare_loop` below): fully_shard per unit (the model's blocks or layers, as its
  spec names them) and at the root, AdamW, a loop over pre-built batches (the toolkit's
  loader's, taken before timing) with forward, backward (gradient sync skipped on all but
  the last micro-step, as the toolkit does), grad-norm clipping, step, zero_grad and
  loss.item(). No toolkit code runs inside its loop but the model's own loss (the spec's:
  `forward(inputs, targets)`, or your model's `loss(output, targets)`).

Any model runs: the built-in presets, your own (`model._target_=...`), a registered one, a
Hugging Face causal LM (`model=hf_llama_tiny`).

Each repetition builds all three from scratch (build time not measured; the order rotates
from one repetition to the next), skips W warm-up steps and times N steps on rank 0
(perf_counter between step ends). The reported figures are the medians over repetitions of
toolkit_step_s / bare_step_s and of toolkit_step_s / toolkit_no_ckpt_step_s (each the median
step time of its repetition) (target <= 1.02). The same ratio in CPU time of rank 0's process
(all threads: the toolkit's prefetch thread counts) is reported beside it: on a machine
shared with other work, wall time swings with the neighbours' load while CPU time per step
does not.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from toolkit.config.model import series_shape
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

    from toolkit.train.models.registry import spec_config, spec_for

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    spec = spec_for(job.model)  # the model class, its units and its loss: not the loop
    torch.manual_seed(job.seed)
    model = spec.build(spec_config(job.model))
    spec.initialise(model)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp_policy = MixedPrecisionPolicy(
        param_dtype=dtypes[job.precision.param_dtype],
        reduce_dtype=dtypes[job.precision.reduce_dtype],
    )
    units = spec.units_of(model)
    for i, unit in enumerate(units):
        fully_shard(unit, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=i < len(units) - 1)
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
        for i, (inputs, targets) in enumerate(micro_batches):
            model.set_requires_gradient_sync(i == accum - 1)  # reduce-scatter once per step
            loss = spec.loss_of(model, (inputs.to(device), targets.to(device))) / accum
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


def with_checkpointing(job: JobConfig, enabled: bool) -> JobConfig:
    """The job with checkpointing armed (hooks on, no save in the timed steps) or off."""
    ckpt = dataclasses.replace(
        job.checkpoint, enabled=enabled, interval_steps=0, save_final=False, resume=False
    )
    return dataclasses.replace(job, checkpoint=ckpt)


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
        if trainer.comm_timer is not None:  # the bare loop that follows runs unwrapped
            trainer.comm_timer.uninstall()
    return clock.ends


def step_seconds(ends: list[float], warmup: int) -> float:
    """Median seconds per step after the warm-up, from step-end timestamps (ends[0]: the
    start). The median, not the mean: on a shared machine single steps stall for whole
    scheduler slices, and those stalls land on A or B by chance."""
    durations = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    return statistics.median(durations[warmup:])


def worker(rank: int, world: int, job: JobConfig, args: dict, out: str) -> None:
    from toolkit.data.tokens import BatchPlan
    from toolkit.distributed.env import discover
    from toolkit.distributed.init import init_distributed, shutdown_distributed
    from toolkit.tasks.train import build_loaders

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
    # The same batches as A's, from the toolkit's own loader, all taken before timing.
    loader, _, _ = build_loaders(job, plan, device, Path(out), env)
    batches = [next(loader)[1] for _ in range(steps)]
    loader.close()
    variants = {
        "toolkit": lambda run_dir: toolkit_loop(
            with_checkpointing(job, True), env, run_dir, device
        ),
        "no_ckpt": lambda run_dir: toolkit_loop(
            with_checkpointing(job, False), env, run_dir, device
        ),
        "bare": lambda run_dir: bare_loop(job, batches, device),
    }
    names = list(variants)
    rows = []
    try:
        for rep in range(args["reps"]):
            # The order rotates: a drift within a repetition lands on each side in turn.
            order = names[rep % 3 :] + names[: rep % 3]
            ends: dict[str, list[tuple[float, float]]] = {}
            for name in order:
                dist.barrier()
                ends[name] = variants[name](Path(out) / f"rep{rep}-{name}")
            w = args["warmup"]
            wall = {n: step_seconds([t[0] for t in e], w) for n, e in ends.items()}
            cpu = {n: step_seconds([t[1] for t in e], w) for n, e in ends.items()}
            a, a0, b = wall["toolkit"], wall["no_ckpt"], wall["bare"]
            rows.append(
                {
                    "rep": rep,
                    "order": order,
                    "toolkit_step_s": a,
                    "toolkit_no_ckpt_step_s": a0,
                    "bare_step_s": b,
                    "ratio": a / b,
                    "hook_ratio": a / a0,
                    "toolkit_cpu_s": cpu["toolkit"],
                    "toolkit_no_ckpt_cpu_s": cpu["no_ckpt"],
                    "bare_cpu_s": cpu["bare"],
                    "cpu_ratio": cpu["toolkit"] / cpu["bare"],
                    "hook_cpu_ratio": cpu["toolkit"] / cpu["no_ckpt"],
                }
            )
            if rank == 0:
                print(
                    f"rep {rep}: wall toolkit {1000 * a:.1f} ms  without checkpointing "
                    f"{1000 * a0:.1f} ms  bare {1000 * b:.1f} ms  ratio {a / b:.3f}  "
                    f"hooks {a / a0:.3f} | CPU ratio {rows[-1]['cpu_ratio']:.3f}  "
                    f"hooks {rows[-1]['hook_cpu_ratio']:.3f}",
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
    from toolkit.data.files import prepare

    user_keys = {o.lstrip("+").split("=", 1)[0] for o in args.overrides}
    # Your own model (`model._target_=...`, `model.kind=NAME`) replaces the default preset.
    user_keys |= {k.split(".")[0] for k in user_keys if k.endswith(("._target_", ".kind"))}
    defaults = [d for d in DEFAULTS if d.split("=", 1)[0] not in user_keys]
    overrides = [*defaults, *args.overrides, f"trainer.steps={args.warmup + args.steps}"]
    try:
        job = to_job(compose_raw(overrides))
    except ConfigError as exc:
        print("\n".join(f"error: {line}" for line in exc.problems), file=sys.stderr)
        return 2
    prepare(job.data, *series_shape(job.model))
    out = (args.out or Path(tempfile.mkdtemp(prefix="overhead-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = {"reps": args.reps, "steps": args.steps, "warmup": args.warmup}
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_ranks(worker, args.world, out, job, settings, str(out))
    rows = json.loads((out / "overhead.json").read_text())
    ratios = [r["ratio"] for r in rows]
    cpu_ratios = [r["cpu_ratio"] for r in rows]
    hook_ratios = [r["hook_ratio"] for r in rows]
    result = {
        "median_ratio": statistics.median(ratios),
        "ratio_min_max": [min(ratios), max(ratios)],
        "median_hook_ratio": statistics.median(hook_ratios),
        "hook_ratio_min_max": [min(hook_ratios), max(hook_ratios)],
        "median_hook_cpu_ratio": statistics.median(r["hook_cpu_ratio"] for r in rows),
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
