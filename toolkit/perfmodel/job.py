"""From a JobConfig to the model's inputs (still pure: no torch, no I/O)."""

from __future__ import annotations

from toolkit.config.job import JobConfig
from toolkit.config.shape import micro_batch_size, tasks_per_node, world_size
from toolkit.perfmodel.model import Layout, Prediction, predict


def layout_from_job(job: JobConfig, world: int | None = None) -> Layout:
    """The layout the launcher would run: world size from the cluster config unless given."""
    world = world_size(job.cluster) if world is None else world
    return Layout(
        world_size=world,
        ranks_per_node=min(world, tasks_per_node(job.cluster)),
        micro_batch_size=micro_batch_size(job.trainer, world),
        grad_accum=job.trainer.grad_accum,
        seq_len=job.data.seq_len,
        param_dtype=job.precision.param_dtype,
        reduce_dtype=job.precision.reduce_dtype,
        replicate=job.parallel.dp_replicate,
        reshard_after_forward=job.parallel.reshard_after_forward,
        activation_checkpointing=job.parallel.activation_checkpointing,
    )


def predict_job(job: JobConfig, world: int | None = None) -> Prediction:
    return predict(job.model, layout_from_job(job, world), job.hardware)
