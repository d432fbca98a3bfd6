"""One device mesh for every kind of parallelism, and a record of who is in which group.

The mesh has four named dimensions, outermost first: pp, dp_replicate, dp_shard, tp
(toolkit.config.parallel.MeshShape). Ranks are numbered node by node (Slurm's block
distribution, the local executor's one node), and tp varies fastest, so a tensor-parallel
group is tp consecutive ranks, inside one node whenever tp divides the ranks per node;
pipeline stages are the outermost dimension, so they go across nodes first.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from toolkit.config.parallel import MeshShape

log = logging.getLogger(__name__)

HOST_BYTES = 64  # hostnames are at most 64 bytes (HOST_NAME_MAX on Linux)


def build_mesh(shape: MeshShape, device_type: str) -> DeviceMesh:
    """The job's mesh, every dimension named (size-1 dimensions included)."""
    if shape.world_size != dist.get_world_size():
        raise RuntimeError(
            f"mesh {shape.describe()} has {shape.world_size} ranks, the job {dist.get_world_size()}"
        )
    return init_device_mesh(device_type, shape.sizes, mesh_dim_names=MeshShape.NAMES)


def data_parallel_mesh(mesh: DeviceMesh, shape: MeshShape) -> DeviceMesh:
    """The mesh FSDP2 shards over: ('dp_shard',), or ('dp_replicate', 'dp_shard') for HSDP."""
    if shape.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]


def gather_hosts(device: torch.device) -> list[str]:
    """Every rank's node, in rank order: Slurm's node name in a job (SLURMD_NODENAME: nodes
    that share a host, as the dev cluster's do, stay apart), else the hostname. Fixed-size
    byte tensors through all_gather (no pickled objects cross the wire)."""
    name = (os.environ.get("SLURMD_NODENAME") or socket.gethostname()).encode()[:HOST_BYTES]
    mine = torch.zeros(HOST_BYTES, dtype=torch.uint8, device=device)
    mine[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [bytes(t.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for t in everyone]


def layout_record(shape: MeshShape, hosts: list[str]) -> dict[str, Any]:
    """Which global ranks form each group, on which hosts, and what spans nodes."""
    groups = {
        name: [
            {"ranks": ranks, "hosts": sorted({hosts[r] for r in ranks})}
            for ranks in shape.groups(name)
        ]
        for name, size in shape.degrees().items()
        if size > 1
    }
    warnings = []
    for group in groups.get("tp", []):
        if len(group["hosts"]) > 1:
            warnings.append(
                f"tensor-parallel group of ranks {group['ranks']} spans {len(group['hosts'])} "
                f"nodes ({', '.join(group['hosts'])}): its per-layer collectives cross the "
                f"inter-node network; make parallel.tp={shape.tp} divide the ranks per node"
            )
            break
    return {
        "degrees": shape.degrees(),
        "describe": shape.describe(),
        "hosts_by_rank": hosts,
        "groups": groups,
        "warnings": warnings,
    }


def record_layout(shape: MeshShape, device: torch.device, path: Path) -> dict[str, Any]:
    """Gather the hosts (a collective: every rank calls it), log the warnings on rank 0 and
    write the record there (0600)."""
    record = layout_record(shape, gather_hosts(device))
    if dist.get_rank() == 0:
        for line in record["warnings"]:
            log.warning(line)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
    return record
