"""From a JobConfig to the model's inputs (still pure: no torch, no I/O)."""

from __future__ import annotations

from toolkit.config.job import JobConfig
from toolkit.config.parallel import mesh_shape
from toolkit.config.shape import tasks_per_node, world_size
from toolkit.perfmodel.model import Layout, Prediction, predict


def layout_from_job(job: JobConfig, world: int | None = None) -> Layout:
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
    return Layout(
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
        kernels=job.model.kernels,
        optimizer=job.optim.name,
    )


def predict_job(job: JobConfig, world: int | None = None) -> Prediction:
    return predict(job.model, layout_from_job(job, world), job.hardware)
