"""The launcher's checks of the model group: the spec of a model of yours can be found and
built as configured, and supports the layout asked for; the job fits the memory its ranks
will have (one line each, before any rank starts). Imports torch and your package only for
such a model: the built-in kinds need nothing beyond their own config checks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from toolkit.config.model import TransformerConfig
from toolkit.config.parallel import mesh_shape
from toolkit.config.shape import tasks_per_node
from toolkit.perfmodel.job import memory_problems as modelled_memory_problems


def model_problems(job: Any, world: int) -> list[str]:
    if isinstance(job.model, TransformerConfig):
        return []
    from toolkit.train.models.registry import problems

    shape = mesh_shape(job.parallel, world)
    tp, pp = (1, 1) if isinstance(shape, str) else (shape.tp, shape.pp)
    return problems(job.model, tp, pp)


def host_bytes_per_rank(ranks: int) -> float | None:
    """This host's available memory (/proc/meminfo MemAvailable) shared by `ranks` ranks;
    None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / max(1, ranks)
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_problems(job: Any, world: int) -> list[str]:
    """The memory model's check (toolkit.perfmodel.job.memory_problems) against the memory
    the ranks will have: local CPU ranks (hardware=cpu, cluster=local) share this host's
    available memory, not hardware=cpu's nominal 16 GB device; elsewhere the profile's."""
    hardware = job.hardware
    if hardware.name == "cpu" and job.cluster.kind == "local":
        ranks = tasks_per_node(job.cluster)
        per_rank = host_bytes_per_rank(ranks)
        if per_rank is not None:
            host = replace(hardware, memory_bytes=per_rank)
            said = f"hardware=cpu: this host's available memory shared by {ranks} rank(s)"
            return modelled_memory_problems(job, world, host, said)
    return modelled_memory_problems(job, world)
