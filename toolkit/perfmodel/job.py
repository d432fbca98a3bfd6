"""From a JobConfig to the model's inputs (still pure: no torch, no I/O)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

from toolkit.config.errors import switch
from toolkit.config.hardware import HardwareConfig
from toolkit.config.job import JobConfig
from toolkit.config.model import TransformerConfig
from toolkit.config.parallel import mesh_shape
from toolkit.config.parallel import problems as parallel_problems
from toolkit.config.shape import tasks_per_node, world_size
from toolkit.perfmodel.counted_model import CountedShape
from toolkit.perfmodel.model import Layout, Prediction, predict
from toolkit.perfmodel.small import packed

GRAD_SYNC_MODES = ("last", "every")  # what trainer.grad_sync=auto chooses between


def layout_from_job(job: JobConfig, world: int | None = None, counted: Any = None) -> Layout:
    """The layout the launcher would run: world size from the cluster config unless given;
    the mesh's degrees from parallel (toolkit.config.parallel.mesh_shape). A layout whose
    degrees do not multiply to the world size is refused at launch; here it raises."""
    world = world_size(job.cluster) if world is None else world
    shape = mesh_shape(job.parallel, world)
    if isinstance(shape, str):
        raise ValueError(shape)
    trainer = job.trainer
    if trainer.global_batch_size is None:
        micro = trainer.micro_batch_size
    else:  # the global batch is split over the data-parallel ranks only
        micro = trainer.global_batch_size // (shape.dp * trainer.grad_accum)
    par = job.parallel
    layout = Layout(
        world_size=world,
        ranks_per_node=min(world, tasks_per_node(job.cluster)),
        micro_batch_size=micro,
        grad_accum=trainer.grad_accum,
        seq_len=job.data.seq_len,
        param_dtype=job.precision.param_dtype,
        reduce_dtype=job.precision.reduce_dtype,
        replicate=shape.dp_replicate,
        reshard_after_forward=par.reshard_after_forward,
        activation_checkpointing=par.activation_checkpointing,
        tp=shape.tp,
        pp=shape.pp,
        pp_schedule=par.pp_schedule,
        pp_virtual_stages=par.pp_virtual_stages,
        pp_split=tuple(par.pp_split),
        kernels=getattr(job.model, "kernels", "torch"),
        optimizer=job.optim.name,
        reshard_between_micro_steps=trainer.reshard_between_micro_steps,
        fused_optimizer=fused_optimizer(job),
    )
    if shape.pp > 1:  # torch's PipelineStage: reduce after the last micro-batch, keep gathered
        return replace(layout, grad_sync="last", reshard_between_micro_steps=False)
    if trainer.grad_sync != "auto":
        return replace(layout, grad_sync=trainer.grad_sync)
    model = counted if counted is not None else job.model
    if not isinstance(model, TransformerConfig | CountedShape):
        return replace(layout, grad_sync="every")
    return replace(layout, grad_sync=grad_sync_choice(model, layout, job.hardware)[0])


def fused_optimizer(job: JobConfig) -> bool:
    """Whether AdamW's step runs fused (toolkit.train.optim.step_kernels): optim.fused=on, or
    auto on a GPU preset (the ranks' device is CUDA), for the toolkit's AdamW."""
    mode = switch(getattr(job.optim, "fused", "off"))
    gpu = job.hardware.num_sms > 0
    return getattr(job.optim, "name", None) == "adamw" and (
        mode == "on" or (mode == "auto" and gpu)
    )


def grad_sync_choice(
    model: TransformerConfig | CountedShape, layout: Layout, hw: HardwareConfig
) -> tuple[str, str]:
    """trainer.grad_sync=auto resolved: (mode, why). "last" where it fits and is predicted
    no slower than "every" (it moves grad_accum x fewer reduce-scatter bytes), else
    "every" (its gradient memory does not grow to the whole model); "every" also where
    neither fits, as the smaller of the two."""
    if layout.grad_accum == 1:
        return "every", "grad_accum=1: one micro-step, reduced once either way"
    last, every = (predict(model, replace(layout, grad_sync=m), hw) for m in GRAD_SYNC_MODES)

    def said(p: Prediction) -> str:
        return f"peak {p.memory['peak_bytes'] / 2**20:,.1f} MiB, step {p.step_s * 1e3:,.1f} ms"

    both = f"last: {said(last)}; every: {said(every)}; device {capacity_gib(last)}"
    if last.fits and (not every.fits or last.step_s <= every.step_s):
        return "last", f"fits and is no slower ({both})"
    if every.fits:
        why = "faster" if last.fits else "last does not fit"
        return "every", f"{why} ({both})"
    return "every", f"neither fits, every needs less memory ({both})"


def capacity_gib(p: Prediction) -> str:
    return f"{p.memory['capacity_bytes'] / 2**20:,.0f} MiB per rank"


def job_grad_sync(job: JobConfig, world: int | None = None) -> tuple[str, str]:
    """trainer.grad_sync as the job runs it, and why (the performance model's choice for
    auto; toolkit.train.steps.Accumulation applies it)."""
    mode = job.trainer.grad_sync
    if job.parallel.pp > 1:
        return "last", "pipeline: torch's PipelineStage reduces after the last micro-batch"
    if mode != "auto":
        return mode, "set: trainer.grad_sync"
    if not isinstance(job.model, TransformerConfig):
        return (
            "every",
            "auto, no performance model for this model: every, whose gradient memory does not grow with accumulation",
        )
    layout = layout_from_job(job, world)
    return grad_sync_choice(job.model, layout, job.hardware)


def layout_problems(job: JobConfig, world: int | None = None) -> list[str]:
    """What the launcher refuses about this layout (toolkit.config.parallel.problems: e.g. a
    pipeline schedule with fewer micro-batches than its stages), one line each: a layout
    that cannot run has no prediction."""
    world = world_size(job.cluster) if world is None else world
    return parallel_problems(job.parallel, world, job.model, job.trainer.grad_accum)


def checkpoint_stall_s(job: JobConfig, state_bytes: float) -> float:
    """Seconds per step the training loop stalls for checkpoints: an async save stages the
    rank's parameters and optimizer state (`state_bytes`) into host memory at
    `host_device_bandwidth` (a device-to-host copy on GPU, a memory copy on CPU) while the
    loop waits, once every `checkpoint.interval_steps` steps; the write runs in the
    background. A blocking save also waits for the write, whose storage bandwidth the
    hardware profile does not hold: the staging copy is then a lower bound."""
    ckpt = job.checkpoint
    if not ckpt.enabled or ckpt.interval_steps <= 0:
        return 0.0
    return state_bytes / job.hardware.host_device_bandwidth / ckpt.interval_steps


def predict_job(job: JobConfig, world: int | None = None, counted: Any = None) -> Prediction:
    """The prediction for a job as launched, the checkpoint stall included in the step, K
    members of trainer.ensemble packed in it (toolkit.perfmodel.small.packed). A
    model without the analytic terms (your own) needs `counted`: its CountedShape
    (toolkit.perfmodel.count_job.counted_shape counts it)."""
    model = counted if counted is not None else job.model
    if not isinstance(model, TransformerConfig | CountedShape):
        raise ValueError(
            f"model {type(job.model).__name__}: the performance model needs its counted costs "
            "(toolkit.perfmodel.count_job.counted_shape)"
        )
    p = predict(model, layout_from_job(job, world, counted), job.hardware)
    p = packed(p, job.trainer.ensemble)  # K members: one launch floor, K x the rest
    stall = checkpoint_stall_s(job, p.memory["params_bytes"] + p.memory["optimizer_bytes"])
    time = {**p.time, "checkpoint_stall_s": stall, "step_s": float(p.time["step_s"]) + stall}
    return replace(p, time=time)


# The memory model's peak is an estimate (docs/perfmodel.md): a job is refused at launch only
# when its peak is well past the device, and warned about when just past it.
REFUSE_OVER_CAPACITY = 1.5


def memory_problems(
    job: JobConfig, world: int, hardware: HardwareConfig | None = None, capacity: str = ""
) -> list[str]:
    """The launcher's check that the job fits its devices' memory (toolkit.perfmodel.memory):
    one line naming the peak, the capacity and the largest term, before any rank starts to
    fail in the allocator. Models the memory model does not cover are not checked.
    `hardware`: the profile to check against (the job's by default), named by `capacity`."""
    hardware = hardware or job.hardware
    capacity = capacity or f"hardware={hardware.name}"
    try:
        p = packed(predict(job.model, layout_from_job(job, world), hardware), job.trainer.ensemble)
    except Exception:  # noqa: BLE001 - no model of this job's memory: nothing to check
        return []
    if p.fits:
        return []
    m = p.memory
    t = job.trainer
    field = (
        f"trainer.micro_batch_size={t.micro_batch_size}"
        if t.global_batch_size is None
        else f"trainer.global_batch_size={t.global_batch_size}"
    )
    fewer = ""
    if t.ensemble > 1:  # K members: K x one model's memory (toolkit.perfmodel.small.packed)
        field = f"trainer.ensemble={t.ensemble} with {field}"
        fewer = "pack fewer members (trainer.ensemble), "
    what = (
        f"{field}: {p.does_not_fit()} "
        f"({capacity}); {fewer}lower trainer.micro_batch_size or data.seq_len, "
        "raise trainer.grad_accum, or set parallel.activation_checkpointing=true"
    )
    if m["peak_bytes"] > REFUSE_OVER_CAPACITY * m["capacity_bytes"]:
        return [what]
    warnings.warn(f"may not fit in memory: {what}", stacklevel=2)
    return []
