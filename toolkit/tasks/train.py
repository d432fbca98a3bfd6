"""`task=train`: the composition root. Builds each component from its own config, wires
checkpointing and scheduler control to the loop as hooks, and runs it. This is the only
place that sees the whole job config inside a rank."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from toolkit.config.data import DatasetConfig, order_seed
from toolkit.config.job import JobConfig
from toolkit.config.model import TransformerConfig, series_shape, vocab_size
from toolkit.config.parallel import MeshShape, mesh_shape, pipeline_stages
from toolkit.config.shape import micro_batch_size
from toolkit.data.tokens import BatchPlan
from toolkit.distributed.commtime import CommTimer
from toolkit.distributed.env import DistEnv
from toolkit.distributed.fsdp import local_param_bytes, parallelize
from toolkit.distributed.mesh import build_mesh, data_parallel_mesh, record_layout
from toolkit.distributed.step_overhead import apply_step_settings
from toolkit.distributed.tensor_parallel import loss_context
from toolkit.errors import EXIT_CHECKPOINT_UNUSABLE, USER_ERROR_EXITS, UserError
from toolkit.events import Fanout, json_safe
from toolkit.kernels.liger import resolve as resolve_kernels
from toolkit.perfmodel import balanced_split, layer_costs
from toolkit.perfmodel.job import job_grad_sync
from toolkit.tasks.train_hooks import build_hooks, build_sinks, heartbeat_of, tracker_sinks_of
from toolkit.train.ensemble import Member, as_member_optim, set_dropout_rate, solo_member
from toolkit.train.ensemble_parts import build_ensemble
from toolkit.train.loop import Trainer
from toolkit.train.models import use_kernels
from toolkit.train.models.registry import spec_config, spec_for
from toolkit.train.models.spec import ModelSpec
from toolkit.train.optim import build_optimizer, build_scheduler
from toolkit.train.parts import Data, Instruments, Learning
from toolkit.train.steps import Accumulation

log = logging.getLogger(__name__)


def write_shard_info(model: torch.nn.Module, path: Path) -> None:
    """What this rank holds of the model: evidence that FSDP shards (about 1/world each)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"param_bytes_local": local_param_bytes(model), "param_bytes_total": total})
    )


def build_loaders(
    job: JobConfig, plan: BatchPlan, device: torch.device, run_dir: Path, env: DistEnv
):
    """Training and validation loaders, and the validation metric besides the loss.

    data=returns: multi-process loading of a dataset (toolkit.data), normalised with the
    training period's statistics (saved in the run dir, and in checkpoints with the loader's
    state), validated by information coefficient. A bad dataset is the user's to fix: one
    line (the launcher has usually caught it already). data._target_: your own Dataset
    (toolkit.data.user). data=text|synthetic: token windows (toolkit.data.tokens). All three
    implement toolkit.data.loader.Loader."""
    # Where samples are cut (data.placement): on the device when the data fits its budget,
    # else streamed or on the host (toolkit.data.device); rank 0's log says which and why.
    if isinstance(job.data, DatasetConfig):
        from toolkit.data.device import dataset_loaders

        pin = job.data.pin_memory and device.type == "cuda"
        train, val, placement = dataset_loaders(job.data, plan, device, pin, env.local_world_size)
        if env.is_rank0:
            log.info(placement.line)
        return train, val, None
    if job.data.kind == "returns":
        from toolkit.data.device import market_loaders
        from toolkit.data.loader import SamplePlan
        from toolkit.data.manifest import DataError
        from toolkit.train.metrics import rank_ic

        try:
            train, val, placement = market_loaders(
                job.data,
                SamplePlan(**dataclasses.asdict(plan)),
                *series_shape(job.model),
                device,
                pin_memory=job.data.pin_memory and device.type == "cuda",
                run_dir=run_dir if env.is_rank0 else None,
                ranks_per_host=env.local_world_size,
            )
        except DataError as exc:
            raise UserError(str(exc), EXIT_CHECKPOINT_UNUSABLE) from exc
        if env.is_rank0:
            log.info(placement.line)
        if job.data.sample == "per_instrument":  # one row per instrument: group by time step
            return train, val, functools.partial(rank_ic, group=val.windows.num_instruments)
        return train, val, rank_ic
    from toolkit.data.tokens import build_loaders as build_token_loaders

    pin = job.data.pin_memory and device.type == "cuda"
    return (*build_token_loaders(job.data, plan, vocab_size(job.model) or 256, pin), None)


def pipeline_split(job: JobConfig, shape: MeshShape) -> list[int]:
    """Layers per pipeline stage: parallel.pp_split, or balanced on the performance model's
    per-layer cost (the embedding on the first stage, head and loss on the last)."""
    if job.parallel.pp_split:
        return list(job.parallel.pp_split)
    costs = layer_costs(
        job.model,
        job.data.seq_len,
        job.hardware,
        micro_batch_size=micro_batch_size(job.trainer, shape.dp),
        dtype=job.precision.param_dtype,
        tp=shape.tp,
        recompute=job.parallel.activation_checkpointing,
    )
    return balanced_split(costs, pipeline_stages(job.parallel))


def choose_kernels(
    model: torch.nn.Module,
    job: JobConfig,
    shape: MeshShape,
    device: torch.device,
    env: DistEnv,
    say: bool = True,
) -> str:
    """model.kernels resolved for this device and layout (toolkit.kernels.liger), set on the
    model before it is split or sharded; rank 0 logs the choice and why (`say`: an
    ensemble's first member only)."""
    reasons: list[str] = []
    kernels = resolve_kernels(job.model.kernels, device, reasons, tp=shape.tp)
    reasons += use_kernels(model, kernels, compiled_blocks=job.parallel.compile)
    if env.is_rank0 and say:
        log.info("kernels: %s (%s)", kernels, "; ".join(reasons))
    return kernels


def new_model(
    job: JobConfig,
    spec: ModelSpec,
    shape: MeshShape,
    device: torch.device,
    env: DistEnv,
    say: bool = True,
) -> torch.nn.Module:
    """The model as the spec builds it from the current RNG state, its kernels chosen, and
    initialised (on the meta device under parallel.meta_init: initialised after sharding).
    `say`: log the kernels chosen (an ensemble's first member only)."""
    model = spec.build(spec_config(job.model))
    if isinstance(job.model, TransformerConfig):  # the built-ins' fused kernels
        choose_kernels(model, job, shape, device, env, say)
    if job.parallel.meta_init:
        return model.to("meta")
    spec.initialise(model)  # on CPU, before sharding: identical for every world size
    return model


def member_builder(
    job: JobConfig, spec: ModelSpec, shape: MeshShape, device: torch.device, env: DistEnv
):
    """new_model for each member of an ensemble, the kernels logged for the first only."""
    count = 0

    def build() -> torch.nn.Module:
        nonlocal count
        count += 1
        return new_model(job, spec, shape, device, env, say=count == 1)

    return build


def build_model(
    job: JobConfig,
    env: DistEnv,
    run_dir: Path,
    device: torch.device,
    shape: MeshShape,
    spec: ModelSpec,
    member: Member | None = None,
) -> tuple[torch.nn.Module, Any]:
    """This rank's model, split into pipeline stages or sharded (FSDP2, tp), on `device`;
    and the pipeline (None without pipeline parallelism). `member`: one member of an
    ensemble run alone (its seed and dropout; toolkit.train.ensemble.solo_member)."""
    torch.manual_seed(job.seed if member is None else member.seed)
    model = new_model(job, spec, shape, device, env)
    if member is not None and member.dropout is not None:
        set_dropout_rate(model, member.dropout, "trainer.members[0]")
    mesh = build_mesh(shape, device.type)
    record_layout(shape, device, run_dir / "mesh.json")
    pipe = None
    if shape.pp > 1:  # this rank's stages: tensor parallel, then sharded over the dp dims
        # Imported here: torch.distributed.pipelining brings torch._dynamo (~0.5 s a rank).
        from toolkit.train.pipeline import build_pipeline

        split = pipeline_split(job, shape)
        pipe = build_pipeline(
            model, mesh, shape, job.parallel, job.precision, split, spec.tensor_parallel
        )
        model = pipe.model
    else:
        if shape.tp > 1 and spec.tensor_parallel is not None:  # tp, then FSDP2 over dp (2D)
            model = spec.tensor_parallel(model, mesh["tp"])
        units = spec.units_of(model)
        model = parallelize(
            model, data_parallel_mesh(mesh, shape), job.parallel, job.precision, units
        )
    if job.parallel.meta_init:
        model.to_empty(device=device)
        torch.manual_seed(job.seed + env.rank)
        spec.initialise(model)
    else:
        model.to(device)
    return model, pipe


def batch_plan(job: JobConfig, shape: MeshShape, rank: int) -> BatchPlan:
    """Which samples rank `rank` reads at each step. Batches are split over the data-parallel
    ranks (tp and pp peers read the same slice); their order, training and validation, is
    data.order_seed's, or the job's seed when data.order_seed is unset."""
    return BatchPlan(
        seed=order_seed(job.data, job.seed),
        seq_len=job.data.seq_len,
        micro_batch_size=micro_batch_size(job.trainer, shape.dp),
        grad_accum=job.trainer.grad_accum,
        world_size=shape.dp,
        rank=shape.dp_rank(rank),
    )


def build_trainer(job: JobConfig, env: DistEnv, run_dir: Path, device: torch.device) -> Trainer:
    shape = mesh_shape(job.parallel, dist.get_world_size())
    if isinstance(shape, str):  # the launcher validated it; a hand-built job may not be
        raise ValueError(shape)
    spec = spec_for(job.model)
    for line in apply_step_settings(job.precision, job.parallel, device):  # TF32, CUDA graphs
        if env.is_rank0:
            log.info(line)
    member = solo_member(job.trainer, job.seed, job.optim)
    if member is not None:  # one member alone: its optimizer settings, the job's data order
        job = dataclasses.replace(job, optim=as_member_optim(job.optim, member))
    ensemble = None
    if job.trainer.ensemble > 1:  # K members, whole in every rank (toolkit.train.ensemble)
        ensemble = build_ensemble(
            job.trainer,
            job.optim,
            job.seed,
            member_builder(job, spec, shape, device, env),
            spec.loss_of,
            device,
            run_dir,
            env.rank,
            getattr(torch, job.precision.param_dtype),  # validated: float32|bfloat16|float16
            data_seed=order_seed(job.data, job.seed),
        )
        model, pipe = ensemble.stack.model, None
        record_layout(shape, device, run_dir / "mesh.json")
    else:
        model, pipe = build_model(job, env, run_dir, device, shape, spec, member)

    write_shard_info(model, run_dir / "metrics" / f"rank{env.rank}-model.json")
    plan = batch_plan(job, shape, env.rank)
    loader, val_loader, eval_metric = build_loaders(job, plan, device, run_dir, env)

    if ensemble is not None:
        optimizer, scheduler = ensemble.optimizer, ensemble.scheduler
    else:
        optimizer = build_optimizer(model, job.optim)
        scheduler = build_scheduler(optimizer, job.optim, job.trainer.steps)
    sinks = build_sinks(job, env, run_dir)
    sink = Fanout(sinks)
    heartbeat = heartbeat_of(sinks)
    if ensemble is not None:  # each member's values go to the trackers, not the console
        ensemble.members.trackers = Fanout(tracker_sinks_of(sinks))
    # One set of wrappers on torch.distributed: timing per kind, and/or the collective each
    # rank is in for the hang watchdog.
    comm = None
    if job.telemetry.comm_timing or heartbeat is not None:
        comm = CommTimer(
            progress=heartbeat, timing=job.telemetry.comm_timing, cuda=device.type == "cuda"
        ).install()
    if ensemble is not None:
        strategy = ensemble.step
    elif pipe is not None:
        from toolkit.train.pipeline import PipelineStep

        loss_ranks = shape.world_size // shape.pp  # the last stage's ranks hold the loss
        strategy = PipelineStep(
            pipe, job.parallel.pp_schedule, device, model.loss, loss_ranks, timer=comm
        )
    else:
        strategy = Accumulation(
            model,
            device,
            loss_context(shape.tp),
            comm,
            spec.loss_of,
            spec.predict,
            *micro_step_sync(job, env),
        )
    learning = Learning(
        model,
        optimizer,
        scheduler,
        strategy,
        grad_clip=job.optim.grad_clip,
        members=ensemble.members if ensemble is not None else None,
    )
    instruments = Instruments(
        sink,
        device,
        peak_flops=job.hardware.peak_flops(job.precision.param_dtype),
        flops_per_sample=model_flops_per_sample(spec, job),
        count_flops=flops_counter(spec, job, run_dir if env.is_rank0 else None),
        throughput_unit=spec.unit,
        fault=job.fault,
        comm_timer=comm,  # timing=False: take() reports zeros, as with no timer
        heartbeat=heartbeat,
    )
    trainer = Trainer(
        job.trainer,
        learning,
        Data(loader, val_loader, eval_metric),
        instruments,
        hooks=build_hooks(job, env, run_dir, sink),
        layout=shape.degrees(),
    )
    return trainer


def micro_step_sync(job: JobConfig, env: DistEnv) -> tuple[str, bool]:
    """(trainer.grad_sync resolved, trainer.reshard_between_micro_steps) for Accumulation;
    rank 0 logs the choice and why. (A pipeline's stages reduce once, after the last
    micro-batch, and keep their parameters gathered between micro-batches: torch's
    PipelineStage decides that, whatever these say.)"""
    mode, why = job_grad_sync(job, dist.get_world_size())
    if env.is_rank0 and job.trainer.grad_accum > 1:
        log.info(
            "grad_sync: %s (%s); reshard_between_micro_steps: %s",
            mode,
            why,
            job.trainer.reshard_between_micro_steps,
        )
    return mode, job.trainer.reshard_between_micro_steps


def model_flops_per_sample(spec: ModelSpec, job: JobConfig) -> float:
    """The spec's analytic FLOPs per sample; 0 until counted (flops_counter)."""
    if spec.flops_per_sample is not None:
        return spec.flops_per_sample(spec_config(job.model), job.data.seq_len)
    return 0.0


def flops_counter(spec: ModelSpec, job: JobConfig, record_in: Path | None = None):
    """For a model without analytic FLOPs: a function counting them per sample on its first
    micro-batch (toolkit.perfmodel.counted: one forward + backward on meta tensors, no real
    memory), so that MFU is the model's own. On rank 0 (`record_in`: the run dir) the same
    first micro-batch records RUN/model.json for the run's readers, which never build the
    model themselves. None when there is nothing to count or record."""
    if spec.flops_per_sample is not None and record_in is None:
        return None
    from toolkit.perfmodel.count_job import record_run_model, run_model

    analytic = model_flops_per_sample(spec, job)

    def per_sample(batch: Any) -> float:
        try:
            if record_in is None:
                return run_model(job, batch).flops_per_sample
            return record_run_model(job, record_in, batch).flops_per_sample
        except Exception as exc:  # noqa: BLE001 - MFU is a report, never a reason to stop
            log.warning("model not recorded: counting its FLOPs failed: %s", exc)
            return analytic

    return per_sample


def run(job: JobConfig, env: DistEnv, run_dir: Path, device: torch.device) -> dict[str, Any]:
    return fit_and_report(build_trainer(job, env, run_dir, device), env, run_dir)


def fit_and_report(trainer: Trainer, env: DistEnv, run_dir: Path) -> dict[str, Any]:
    """Train, close the sinks, and on rank 0 write summary.json and print the summary."""
    try:
        summary = trainer.fit()
        summary["run_dir"] = str(run_dir)
        if isinstance(trainer.strategy, Accumulation):  # which gradient sync ran
            summary["grad_sync"] = trainer.strategy.grad_sync
            summary["reshard_between_micro_steps"] = trainer.strategy.reshard_between_micro_steps
        if trainer.members is not None:
            summary["ensemble"] = len(trainer.members.members)
            summary["members_dropped"] = {
                m.name: step
                for m, step in zip(trainer.members.members, trainer.members.dropped_at, strict=True)
                if step is not None
            }
        if env.is_rank0:  # before the sinks close: the trackers upload it; NaN -> null
            (run_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2))
            if trainer.members is not None:  # RUN/members/<name>/summary.json
                trainer.members.write_summaries(summary)
    finally:
        trainer.sink.close()
        if trainer.members is not None:
            trainer.members.close()
        trainer.watch.uninstall()
    if env.is_rank0:
        print_summary(summary)
    stop = trainer.stop
    if stop is not None and stop.exit_code in USER_ERROR_EXITS:  # e.g. a non-finite loss
        raise UserError(stop.reason, stop.exit_code)  # one line from rank 0, no traceback
    return summary


def print_summary(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="run summary", show_header=False)
    rows = [
        ("steps", f"{s['steps']} ({s['stop_reason']})"),
        ("time", f"{s['time_s']:.1f} s"),
        (
            "loss",
            f"{s['first_loss']:.4f} -> {s['final_loss']:.4f}"
            if s["final_loss"] is not None
            else "-",
        ),
        ("val loss", f"{s['val_loss']:.4f}" if s["val_loss"] is not None else "-"),
        *([("val IC (rank corr.)", f"{s['val_ic']:.4f}")] if "val_ic" in s else []),
        ("data wait", f"{100 * s['data_wait_share']:.2f}% of step time"),
        (
            f"median {s['throughput_unit']}/s",
            f"{s['median_tokens_per_s' if s['throughput_unit'] == 'tokens' else 'median_samples_per_s']:,.0f}",
        ),
        ("median MFU", f"{100 * s['median_mfu']:.2f}%"),
        ("peak memory", f"{s['peak_memory_bytes'] / 2**20:,.0f} MiB"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console = Console()
    console.print(table)
    console.print(f"run dir: {s['run_dir']}", soft_wrap=True)
