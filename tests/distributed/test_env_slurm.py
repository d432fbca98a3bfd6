"""Rank, world and rendezvous discovery from the variables srun sets in every task."""

from __future__ import annotations

import pytest

from toolkit import slurm_cli
from toolkit.distributed.env import discover, expand_nodelist, port_from_job_id


@pytest.fixture(autouse=True)
def no_scontrol(monkeypatch):
    """Parse nodelists in Python: these tests must not depend on a reachable cluster."""
    monkeypatch.setattr(slurm_cli.shutil, "which", lambda name: None)


def srun_task(procid: int, nodeid: int, localid: int, **extra: str) -> dict[str, str]:
    """What srun sets for one task of `sbatch -N2 --ntasks-per-node=2` (job 4242)."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_PROCID": str(procid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_LOCALID": str(localid),
        **extra,
    }


def test_every_task_finds_its_place_and_the_same_rendezvous():
    envs = [discover(srun_task(p, p // 2, p % 2)) for p in range(4)]
    assert [(e.rank, e.local_rank, e.node_rank) for e in envs] == [
        (0, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
        (3, 1, 1),
    ]
    assert {(e.world_size, e.local_world_size, e.num_nodes) for e in envs} == {(4, 2, 2)}
    # MASTER_ADDR is the first host of the step, MASTER_PORT derived from the job id.
    assert {(e.master_addr, e.master_port) for e in envs} == {("n1", 20000 + 4242 % 20000)}
    assert {e.source for e in envs} == {"slurm"}


def test_the_step_not_the_allocation_decides_the_world():
    # `srun -N1 -n2` inside a 2-node allocation: the step's variables win.
    env = srun_task(
        0,
        0,
        0,
        SLURM_STEP_NODELIST="n2",
        SLURM_STEP_NUM_NODES="1",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_NTASKS="2",
        SLURM_STEP_TASKS_PER_NODE="2",
    )
    found = discover(env)
    assert (found.world_size, found.num_nodes, found.master_addr) == (2, 1, "n2")


def test_array_elements_sharing_a_node_get_different_ports():
    first = discover(srun_task(0, 0, 0, SLURM_JOB_ID="501", SLURM_ARRAY_JOB_ID="500",
                               SLURM_ARRAY_TASK_ID="0"))  # fmt: skip
    second = discover(srun_task(0, 0, 0, SLURM_JOB_ID="502", SLURM_ARRAY_JOB_ID="500",
                                SLURM_ARRAY_TASK_ID="1"))  # fmt: skip
    assert first.master_port != second.master_port
    assert (first.job_id, second.job_id) == ("500_0", "500_1")


def test_an_explicit_master_port_wins():
    assert discover(srun_task(0, 0, 0, MASTER_PORT="29123")).master_port == 29123


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2],b1", ["a1", "a2", "b1"]),
    ],
)
def test_nodelists_expand_like_scontrol_show_hostnames(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_ports_stay_in_the_unprivileged_range():
    assert {port_from_job_id(str(j)) for j in (0, 19999, 20000, 123456789)} <= set(
        range(20000, 40000)
    )
