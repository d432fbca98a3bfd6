"""Collective times by message size and group span: NCCL's ring and tree cost model, the
algorithm its tuner picks, and which link a group of the mesh crosses (every number by hand)."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.config.hardware import HardwareConfig
from toolkit.perfmodel import Layout, comm
from toolkit.perfmodel.steptime import spans, tp_span

# An H100 node as the preset gives it: NVLink 450 GB/s, 8 NICs x 50 GB/s, NCCL's latencies
# (8.4 us per call, 3.4 us per NVLink step, 14 us per network step).
H100 = dataclasses.replace(
    HardwareConfig(),
    intra_node_bandwidth=450e9,
    inter_node_bandwidth=50e9,
    nics_per_node=8,
    intra_node_latency_s=8.4e-6,
    inter_node_latency_s=8.4e-6,
    intra_node_step_latency_s=3.4e-6,
    inter_node_step_latency_s=14e-6,
)
NODE = comm.span(H100, 8, 8, 8)  # 8 ranks, one node
FOUR_NODES = comm.span(H100, 32, 8, 8)  # 32 ranks, 8 per node
MIB = 2**20


def test_a_ring_all_gather_inside_a_node_pays_its_steps_and_moves_n_minus_1_over_n():
    # latency 8.4 + 7 steps x 3.4 = 32.2 us; 64 MiB x 7/8 / 450 GB/s = 130.489 us
    t = comm.collective_time("all_gather", 64 * MIB, NODE)
    assert t == pytest.approx(32.2e-6 + 64 * MIB * 7 / 8 / 450e9)
    assert comm.collective_time("reduce_scatter", 64 * MIB, NODE) == t
    # an all-reduce is twice the steps and twice the bytes: 8.4 + 14 x 3.4 = 56 us
    assert comm.collective_time("all_reduce", 64 * MIB, NODE) == pytest.approx(
        56e-6 + 64 * MIB * 2 * 7 / 8 / 450e9
    )


def test_small_messages_are_latency_bound_and_large_ones_reach_the_bus_bandwidth():
    # half the bus bandwidth where bytes x 7/8 / 450e9 equals the 32.2 us latency:
    # 32.2e-6 x 450e9 / (7/8) = 16.56 MB
    half = 32.2e-6 * 450e9 / (7 / 8)
    bus = [s * 7 / 8 / comm.collective_time("all_gather", s, NODE) for s in (4096, half, 2**32)]
    assert bus[0] < 0.001 * 450e9
    assert bus[1] == pytest.approx(225e9)
    assert bus[2] > 0.99 * 450e9


def test_across_nodes_a_ring_crosses_the_nics_a_node_shares():
    # 8 ranks share 8 x 50 GB/s: 50 GB/s each, below NVLink's 450
    assert FOUR_NODES.nodes == 4 and FOUR_NODES.bus_bandwidth == 50e9
    # all-gather: 31 steps, 3 of them across nodes: 8.4 + 28 x 3.4 + 3 x 14 = 145.6 us
    assert comm.collective_time("all_gather", 64 * MIB, FOUR_NODES) == pytest.approx(
        145.6e-6 + 64 * MIB * 31 / 32 / 50e9
    )


def test_the_tuner_takes_tree_for_small_all_reduces_across_nodes_and_ring_for_large():
    # ring: (8.4 + 56 x 3.4 + 6 x 14) x 1.4 (NCCL's multi-node ring plateau) = 395.92 us;
    # tree: 8.4 + 2 x (7 x 3.4 + log2(4) x 14) = 112 us
    small = 1024  # tree: bandwidth 0.5 x 0.92 x 50e9 x 0.9 (correction for 1 KiB)
    assert comm.ring_time("all_reduce", small, FOUR_NODES) == pytest.approx(
        395.92e-6 + 1024 * 2 * 31 / 32 / 50e9
    )
    assert comm.tree_time(small, FOUR_NODES) == pytest.approx(
        112e-6 + 1024 / (0.5 * 0.92 * 50e9 * 0.9)
    )
    assert comm.algorithm("all_reduce", small, FOUR_NODES) == "tree"
    # 1 GiB: ring 395.92 us + 2^30 x 62/32 / 50e9 = 41.99 ms; tree 112 us + 2^30 / 23e9 = 46.8 ms
    large = 2**30
    assert comm.algorithm("all_reduce", large, FOUR_NODES) == "ring"
    assert comm.collective_time("all_reduce", large, FOUR_NODES) == pytest.approx(
        395.92e-6 + large * 62 / 32 / 50e9
    )
    # inside a node NCCL's tree is a chain: ring it is
    assert comm.algorithm("all_reduce", small, NODE) == "ring"


def test_a_group_of_one_costs_nothing_and_an_unknown_kind_is_refused():
    assert comm.collective_time("all_reduce", MIB, comm.span(H100, 1, 8, 8)) == 0.0
    with pytest.raises(ValueError, match="broadcast"):
        comm.collective_time("broadcast", MIB, NODE)


def test_mesh_groups_span_nodes_by_their_stride():
    # 4 nodes x 8: tp 8 fills a node, so each shard group has one rank per node
    tp_fsdp = Layout(
        world_size=32, ranks_per_node=8, micro_batch_size=1, grad_accum=1, seq_len=64, tp=8
    )
    shard = spans(H100, tp_fsdp).shard
    assert (shard.ranks, shard.ranks_per_node, shard.nodes) == (4, 1, 4)
    assert tp_span(H100, tp_fsdp).nodes == 1  # NVLink
    # HSDP with 8-rank shard groups: the shard group is a node, the replica group spans 4
    hsdp = dataclasses.replace(tp_fsdp, tp=1, replicate=4)
    link = spans(H100, hsdp)
    assert (link.shard.nodes, link.shard.bus_bandwidth) == (1, 450e9)
    assert (link.replica.ranks, link.replica.ranks_per_node, link.replica.nodes) == (4, 1, 4)
    # a tp group larger than a node crosses the NICs
    wide = dataclasses.replace(tp_fsdp, world_size=16, tp=16)
    assert (tp_span(H100, wide).nodes, tp_span(H100, wide).bus_bandwidth) == (2, 50e9)
