"""Process-group setup and teardown."""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

from toolkit.distributed.env import DistEnv
from toolkit.distributed.host_memory import keep_freed_memory

log = logging.getLogger(__name__)


def pick_device(env: DistEnv) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cpu_threads(env: DistEnv) -> int:
    """Intra-op threads per CPU rank: cluster.cpus_per_task when given (Slurm's
    SLURM_CPUS_PER_TASK, or TOOLKIT_CPUS_PER_TASK from the local executor), else the cores this
    process may use divided among the node's ranks (without this every rank spawns one thread
    per core). The thread count changes float summation order, so runs compared bit for bit
    must use the same count."""
    allotted = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("TOOLKIT_CPUS_PER_TASK")
    if allotted and allotted.isdigit():
        return max(1, int(allotted))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, env.local_world_size))


def init_distributed(env: DistEnv, timeout_s: float = 600.0) -> torch.device:
    """Join the job's default process group: NCCL on GPUs, gloo on CPU."""
    os.environ["MASTER_ADDR"] = env.master_addr
    os.environ["MASTER_PORT"] = str(env.master_port)
    device = pick_device(env)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(env))
        log.info("rank %d: %s", env.rank, keep_freed_memory())
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )
    return device


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
