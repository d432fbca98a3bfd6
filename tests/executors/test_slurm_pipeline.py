"""Pipeline parallelism across Slurm nodes on the real dev cluster: {pp=2 across the two
nodes, dp_shard=2 inside each} trains with the losses of the same layout run locally."""

from __future__ import annotations

import json

import pytest

from tests.executors.test_slurm_executor import TINY, launch, losses

pytestmark = pytest.mark.slurm

LAYOUT = ["parallel.pp=2", "parallel.dp_shard=2", "trainer.grad_accum=2", "cluster.cpus_per_task=1"]


def test_two_node_pipeline_matches_the_same_layout_run_locally(slurm_cluster, tmp_path):
    local = launch(
        slurm_cluster,
        *TINY,
        *LAYOUT,
        "cluster=local",
        "cluster.tasks_per_node=4",
        f"hydra.run.dir={tmp_path / 'local'}",
    )
    assert local.returncode == 0, local.stderr[-3000:]
    slurm = launch(
        slurm_cluster,
        *TINY,
        *LAYOUT,
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.tasks_per_node=2",
        f"hydra.run.dir={tmp_path / 'slurm'}",
    )
    assert slurm.returncode == 0, slurm.stdout[-3000:] + slurm.stderr[-3000:]
    assert "world 4 (slurm)" in slurm.stderr
    # Same seed, same layout, one thread per rank: the same losses, bit for bit.
    assert len(losses(tmp_path / "slurm")) == 4
    assert losses(tmp_path / "slurm") == losses(tmp_path / "local")
    # The stages go across the nodes, the FSDP shard groups stay inside one each.
    mesh = json.loads((tmp_path / "slurm" / "mesh.json").read_text())
    assert mesh["hosts_by_rank"] == ["n1", "n1", "n2", "n2"]
    pp_groups = mesh["groups"]["pp"]
    assert [g["ranks"] for g in pp_groups] == [[0, 2], [1, 3]]
    assert all(g["hosts"] == ["n1", "n2"] for g in pp_groups)
    shard_groups = mesh["groups"]["dp_shard"]
    assert [(g["ranks"], g["hosts"]) for g in shard_groups] == [([0, 1], ["n1"]), ([2, 3], ["n2"])]
