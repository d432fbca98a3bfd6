"""The launcher's memory check (toolkit.perfmodel.job.memory_problems) against the memory
the ranks will have: local CPU ranks (hardware=cpu, cluster=local) share this host's
available memory, not hardware=cpu's nominal 16 GB device; elsewhere the profile's."""

from __future__ import annotations

from dataclasses import replace

from toolkit.config.job import JobConfig
from toolkit.config.shape import tasks_per_node
from toolkit.distributed.host_memory import host_bytes_per_rank
from toolkit.perfmodel.job import memory_problems as modelled_memory_problems


def memory_problems(job: JobConfig, world: int) -> list[str]:
    hardware = job.hardware
    if hardware.name == "cpu" and job.cluster.kind == "local":
        ranks = tasks_per_node(job.cluster)
        per_rank = host_bytes_per_rank(ranks)
        if per_rank is not None:
            host = replace(hardware, memory_bytes=per_rank)
            said = f"hardware=cpu: this host's available memory shared by {ranks} rank(s)"
            return modelled_memory_problems(job, world, host, said)
    return modelled_memory_problems(job, world)
