"""Who am I in the job? Rank, local rank, world and rendezvous, from the environment.

Sources, in order: torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT: the local executor sets them), then Slurm's (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, SLURM_JOB_NODELIST, SLURM_JOB_ID), else a single process.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from toolkit import slurm_cli

PORT_BASE = 20000
PORT_SPAN = 20000


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str | None = None
    source: str = "single"  # torchrun | slurm | single

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def _int(env: dict[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None:
        if default is None:
            raise RuntimeError(f"environment variable {name} is not set")
        return default
    return int(value)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_from_job_id(job_id: str) -> int:
    """A rendezvous port derived from the job id, so concurrent jobs sharing a node differ.

    Pass SLURM_JOB_ID: every element of a job array has its own (the array's id is
    SLURM_ARRAY_JOB_ID), so elements sharing a node get different ports too."""
    digits = int(re.sub(r"\D", "", job_id) or "0")
    return PORT_BASE + digits % PORT_SPAN


def expand_nodelist(nodelist: str) -> list[str]:
    """Hostnames of a Slurm nodelist: `scontrol show hostnames` when available, else a
    parser for the common forms (n1,n2 / node[1-3,5] / a[01-02],b1)."""
    out = slurm_cli.hostnames(nodelist)
    if out:
        return out
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(prefix + lo)
                continue
            for i in range(int(lo), int(hi) + 1):
                hosts.append(prefix + str(i).zfill(len(lo)))
    return hosts


def discover(environ: dict[str, str] | None = None) -> DistEnv:
    env = dict(os.environ if environ is None else environ)
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE", world)
        rank = _int(env, "RANK")
        return DistEnv(
            rank=rank,
            local_rank=_int(env, "LOCAL_RANK", rank % local_world),
            world_size=world,
            local_world_size=local_world,
            node_rank=_int(env, "GROUP_RANK", rank // local_world),
            num_nodes=max(1, world // local_world),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", 29500),
            job_id=env.get("TOOLKIT_JOB_ID") or env.get("SLURM_JOB_ID"),
            source="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        # Inside `srun` the step's variables describe the ranks; the job's describe the
        # allocation, which may be larger than the step.
        job_id = env.get("SLURM_JOB_ID", "0")
        hosts = expand_nodelist(
            env.get("SLURM_STEP_NODELIST")
            or env.get("SLURM_JOB_NODELIST")
            or env.get("SLURM_NODELIST", "")
        )
        return DistEnv(
            rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            world_size=_int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS")),
            local_world_size=_slurm_tasks_on_node(env),
            node_rank=_int(env, "SLURM_NODEID", 0),
            num_nodes=_int(
                env, "SLURM_STEP_NUM_NODES", _int(env, "SLURM_NNODES", max(1, len(hosts)))
            ),
            # Rank 0 runs on the first host of the step (srun's default block distribution).
            master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", port_from_job_id(job_id)),
            job_id=slurm_job_label(env),
            source="slurm",
        )
    return DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", free_port(), None, "single")


def slurm_job_label(env: dict[str, str]) -> str:
    """How Slurm's tools name this job: '123', or '120_3' for element 3 of array 120."""
    array_id, task_id = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_id and task_id:
        return f"{array_id}_{task_id}"
    return env.get("SLURM_JOB_ID", "0")


def _slurm_tasks_on_node(env: dict[str, str]) -> int:
    """SLURM_STEP_TASKS_PER_NODE looks like '2(x3),1'; pick this node's entry."""
    spec = (
        env.get("SLURM_STEP_TASKS_PER_NODE")
        or env.get("SLURM_TASKS_PER_NODE")
        or env.get("SLURM_NTASKS_PER_NODE")
        or "1"
    )
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else (counts[0] if counts else 1)


def restart_count(environ: dict[str, str] | None = None) -> int:
    """The job attempt: Slurm's restart count (requeues), 0 when run locally."""
    env = os.environ if environ is None else environ
    try:
        return int(env.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0
