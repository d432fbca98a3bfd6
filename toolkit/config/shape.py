"""The job's shape as arithmetic: ranks per node, world size, and the batch per rank.

Pure functions of the config (the only probe is how many GPUs this machine has, for
`tasks_per_node=null` locally); the launcher, executors, the training task, the performance
model and the benchmarks all take the shape from here, so they cannot disagree about it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from toolkit.config.cluster import ClusterConfig
from toolkit.config.trainer import TrainerConfig


def local_gpu_count() -> int:
    """GPUs the ranks started here may use, counted without torch: NVML's device count (the
    driver's own library, package nvidia-ml-py), narrowed by CUDA_VISIBLE_DEVICES as CUDA
    narrows it. Importing torch only to count GPUs cost the launcher 1.1-2 s of every local
    launch that left cluster.tasks_per_node to its default (docs/BENCHMARKS.md, "Issue 37 —
    the launcher without torch"). 0 where NVML is missing or fails: CPU-only."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver / no GPU: behave as CPU-only
        return 0
    return visible_gpu_count(count, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpu_count(count: int, visible: str | None) -> int:
    """Of `count` GPUs, how many CUDA_VISIBLE_DEVICES=`visible` leaves a process: all when
    unset; else its entries up to the first that names no device (CUDA ignores the rest: an
    index out of range, a negative one, an empty entry), UUIDs (GPU-..., MIG-...) taken as
    named, at most `count`."""
    if visible is None:
        return count
    taken = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            taken += 1
            continue
        try:
            index = int(entry)
        except ValueError:
            break
        if not 0 <= index < count:
            break
        taken += 1
    return min(taken, count)


def tasks_per_node(cluster: ClusterConfig) -> int:
    """Resolved ranks per node (None means one per GPU, else 2 locally / 1 on Slurm)."""
    if cluster.tasks_per_node is not None:
        return cluster.tasks_per_node
    if cluster.kind == "slurm":
        return cluster.gpus_per_node or 1
    return local_gpu_count() or 2


def world_size(cluster: ClusterConfig) -> int:
    return cluster.nodes * tasks_per_node(cluster)


def micro_batch_size(trainer: TrainerConfig, world: int) -> int:
    """Sequences per rank per micro-step (global_batch_size, when set, decides)."""
    if trainer.global_batch_size is None:
        return trainer.micro_batch_size
    return trainer.global_batch_size // (world * trainer.grad_accum)


def global_batch_size(trainer: TrainerConfig, world: int) -> int:
    """Sequences per optimizer step over all ranks."""
    return micro_batch_size(trainer, world) * trainer.grad_accum * world


def split_global_batch(global_batch: int, world: int, grad_accum: int) -> tuple[int, int] | None:
    """(micro-batch, accumulation) that make `global_batch` sequences on `world` ranks:
    the given accumulation when it divides, else the nearest one that does; None when
    `global_batch` is not a multiple of `world`. Between two as near, the larger
    accumulation (the smaller micro-batch: less memory per rank)."""
    if global_batch < 1 or world < 1 or global_batch % world:
        return None
    per_rank = global_batch // world
    divisors = [a for a in range(1, per_rank + 1) if per_rank % a == 0]
    accum = min(divisors, key=lambda a: (abs(a - grad_accum), -a))  # a tie: less memory
    return per_rank // accum, accum


@dataclass(frozen=True)
class BatchShape:
    """Where one rank's micro-batches sit in a step's global batch: the data loaders' plans
    (toolkit.data.tokens.BatchPlan, toolkit.data.loader.SamplePlan) share it, so the trainer
    can re-split either on resume."""

    seed: int
    seq_len: int
    micro_batch_size: int
    grad_accum: int
    world_size: int
    rank: int

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.world_size
