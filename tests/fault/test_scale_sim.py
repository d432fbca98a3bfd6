"""The recovery simulation at scale (toolkit.fault.scale_sim): its arithmetic follows what
the code does, and its store-operation counts are those of real gloo ranks."""

from __future__ import annotations

import pytest

from toolkit.fault import scale_measure
from toolkit.fault.scale_sim import Constants, Job, gloo_store_ops, main, simulate

CONSTANTS = Constants(
    store_op_s=1e-5,
    store_ops_per_s=1e5,
    plan_bytes_per_item=200.0,
    unpickle_s_per_item=3e-6,
    metadata_bytes_per_chunk=140.0,
    metadata_unpickle_s_per_chunk=2e-6,
    manifest_bytes_per_file=90.0,
    manifest_parse_s_per_file=7e-7,
)


def phase(ranks: int, name: str):
    return next(p for p in simulate(Job(ranks), CONSTANTS).phases if p.name == name)


def test_plan_gather_through_rank_0_grows_linearly_with_ranks():
    small, big = phase(1024, "dcp_plan"), phase(8192, "dcp_plan")
    assert big.rank0_bytes == pytest.approx(8 * small.rank0_bytes)
    items = Job(1024).param_tensors * Job(1024).items_per_tensor
    assert small.rank0_bytes == pytest.approx(2 * 1024 * items * 200.0)  # gathered + scattered
    assert small.rank0_messages == 2 * 1023


def test_gloo_rendezvous_is_quadratic_in_the_store_and_replica_shards_shrink():
    for ranks in (128, 1024):
        per_rank = sum(gloo_store_ops(ranks).values())
        assert per_rank == 2 * ranks + 1
        # GPU job: the checkpointer's gloo group, plus NCCL's unique id (1 set, N-1 wait+get)
        assert phase(ranks, "rendezvous").store_ops == ranks * per_rank + 1 + 2 * (ranks - 1)
        # every rank's address is set once and got by every rank; NCCL's 128-byte id by all
        assert phase(ranks, "rendezvous").store_bytes == ranks * (ranks + 1) * 178 + ranks * 128
    assert phase(8192, "replica").seconds == pytest.approx(phase(1024, "replica").seconds / 8)
    # each listed file (2 per rank + 3) is stat'ed by one rank and listed by rank 0
    assert phase(1024, "manifest").fs_ops == 2 * (2 * 1024 + 3)


def test_the_memory_path_skips_planning_manifest_and_load():
    recovery = simulate(Job(1024), CONSTANTS, cause="exit")
    by_name = {p.name: p.seconds for p in recovery.phases}
    assert recovery.memory_path_s == pytest.approx(
        by_name["detect"] + by_name["rendezvous"] + by_name["replica"]
    )
    assert recovery.disk_path_s > recovery.memory_path_s + 120.0


def test_bad_arguments_are_one_line_errors(capsys):
    assert main(["--ranks", "1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_measured_plan_and_manifest_constants_come_from_real_objects():
    plan = scale_measure.plan_costs(layers=2, repeats=2)
    assert plan["items"] == 2 * 9 * 4  # 9 parameters a layer, each with 3 optimizer entries
    assert 50 < plan["plan_bytes_per_item"] < 2000
    meta = scale_measure.metadata_costs(chunks=8, tensors=2)
    assert meta["metadata_bytes_per_chunk"] > 0
    rate = scale_measure.store_throughput(clients=2, ops_per_client=20)
    assert rate["ops_per_s"] > 0 and rate["op_median_s"] > 0


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_store_op_counts_match_real_gloo_ranks():
    """Three real gloo processes joining the default group and the checkpointer's group
    through a counting TCPStore make exactly the operations the simulation charges."""
    counted = scale_measure.count_store_ops(3)
    assert sorted(counted) == [0, 1, 2]
    for ops in counted.values():
        assert ops["default_group"] == gloo_store_ops(3)
        assert ops["checkpoint_group"] == gloo_store_ops(3)
        sent = ops["checkpoint_group_bytes"]
        assert sent["get"] == 3 * sent["set"]  # its own address, got by all three ranks
