"""One run of the A/B harness's `ranks` runner (toolkit.bench.ab), in each of K processes:
the toolkit's trainer timed by a step hook, or the `bare` baseline, a loop written the way one
would by hand.

The bare loop: fully_shard per unit (the model's blocks or layers, as its spec names them) and
at the root, AdamW, a loop over pre-built batches (the toolkit's loader's, taken before
timing) with forward, backward (gradient sync skipped on all but the last micro-step, as the
toolkit does), grad-norm clipping, step, zero_grad and loss.item(). No toolkit code runs
inside its loop but the model's own loss (the spec's `forward(inputs, targets)`, or a user
model's `loss(output, targets)`). Any model runs: the presets, a user's (`model._target_=...`),
a Hugging Face causal LM.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from toolkit.config.job import JobConfig
from toolkit.hooks import Hook


class StepClock(Hook):
    """Loop hook: (wall, CPU time of this process) when fit starts and at every step's end,
    and each step's loss and peak memory."""

    def __init__(self) -> None:
        self.ends: list[tuple[float, float]] = []
        self.losses: list[float] = []
        self.peak_bytes = 0

    def on_start(self, trainer: Any) -> None:
        self.ends.append((time.perf_counter(), time.process_time()))

    def after_step(self, trainer: Any, record: Any, votes: list[float]) -> None:
        self.ends.append((time.perf_counter(), time.process_time()))
        self.losses.append(record.loss)
        self.peak_bytes = max(self.peak_bytes, record.mem_peak_bytes)


def bare_loop(
    job: JobConfig, batches: list[list[tuple[torch.Tensor, torch.Tensor]]], device: torch.device
) -> list[tuple[float, float]]:
    """Train on `batches` (one list of micro-batches per step); (wall, CPU) at each step end."""
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
    ends = [(time.perf_counter(), time.process_time())]
    for micro_batches in batches:
        for i, (inputs, targets) in enumerate(micro_batches):
            model.set_requires_gradient_sync(i == accum - 1)  # reduce-scatter once per step
            loss = spec.loss_of(model, (inputs.to(device), targets.to(device))) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        ends.append((time.perf_counter(), time.process_time()))
    return ends


def bare_run(job: JobConfig, env: Any, out: Path, device: torch.device) -> dict[str, Any]:
    from toolkit.config.data import order_seed
    from toolkit.data.tokens import BatchPlan
    from toolkit.tasks.train import build_loaders

    t = job.trainer
    plan = BatchPlan(
        order_seed(job.data, job.seed),
        job.data.seq_len,
        t.micro_batch_size,
        t.grad_accum,
        env.world_size,
        env.rank,
    )
    # The same batches as the toolkit's, from its own loader, all taken before timing.
    loader, _, _ = build_loaders(job, plan, device, out, env)
    batches = [next(loader)[1] for _ in range(t.steps)]
    loader.close()
    ends = bare_loop(job, batches, device)
    return {
        "ends": ends,
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def toolkit_run(job: JobConfig, env: Any, out: Path, device: torch.device) -> dict[str, Any]:
    from toolkit.tasks.train import build_trainer
    from toolkit.train.lowbit import local_state_bytes

    trainer = build_trainer(job, env, out, device)
    clock = StepClock()
    trainer.hooks.append(clock)
    try:
        trainer.fit()
    finally:
        trainer.sink.close()
    # This rank's parameters (a DTensor's local shard), as its optimizer state is this rank's.
    num_params = sum(
        getattr(p, "to_local", lambda p=p: p)().numel() for p in trainer.model.parameters()
    )
    return {
        "ends": clock.ends,
        "losses": clock.losses,
        "peak_memory_bytes": clock.peak_bytes,
        "state_bytes_per_param": local_state_bytes(trainer.optimizer) / num_params,
    }


def run_worker(rank: int, world: int, job: JobConfig, bare: bool, out: str) -> None:
    from toolkit.distributed.env import discover
    from toolkit.distributed.init import init_distributed, shutdown_distributed

    env = discover()  # rank `rank` of `world` (toolkit.bench.ranks)
    device = init_distributed(env, 300.0)
    try:
        run = (bare_run if bare else toolkit_run)(job, env, Path(out), device)
    finally:
        shutdown_distributed()
    if rank == 0:
        (Path(out) / "run.json").write_text(json.dumps(run))
