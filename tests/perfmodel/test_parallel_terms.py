"""Tensor- and pipeline-parallel terms, each checked by hand on a tiny shape
(toolkit.perfmodel.tp, toolkit.perfmodel.pipeline, and their use in memory and step time)."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import GPTConfig
from toolkit.perfmodel import (
    Layout,
    balanced_split,
    comm,
    kernels,
    layer_costs,
    layout_from_job,
    pipeline,
    predict,
    tp,
)
from toolkit.perfmodel.memory import memory
from toolkit.perfmodel.steptime import communication, stage_time

TINY = GPTConfig(name="gpt_tiny", num_layers=2, dim=64, num_heads=4, vocab_size=256)
PEAK = HardwareConfig(peak_flops_fp32=1e11, matmul=[])  # no table: fraction 1
UNIT = 1024 * 64 * 4  # 8 sequences x 128 tokens x dim 64 x fp32 = 262144 bytes


# -- tensor parallelism ------------------------------------------------------------------
def test_tp_splits_matmul_weights_and_keeps_norms_and_positions_whole():
    local = tp.local_params(TINY, 2)
    # block 49408 = 49152 matmul + 256 norm: 49152/2 + 256
    assert local["block"] == 24832
    # token embedding 256*64 = 16384 split, positions 256*64 = 16384 whole
    assert local["embedding"] == 8192 + 16384
    # head 64*256 split + final norm 128 whole
    assert local["head"] == 8192 + 128
    assert local["total"] == 24576 + 2 * 24832 + 8320 == 82560
    assert tp.local_params(TINY, 1)["total"] == 148096  # the model's count


def test_tp_gemms_shrink_their_n_or_k_and_halve_the_flops():
    assert kernels.block_gemm_shapes(TINY, 1024, 2) == [
        ("qkv", 1024, 96, 64),  # column-parallel: 3d / tp outputs
        ("attn_proj", 1024, 64, 32),  # row-parallel: d / tp inputs
        ("fc", 1024, 128, 64),
        ("mlp_proj", 1024, 64, 128),
    ]
    # at peak (no shape table) the GEMM time is FLOPs / peak: half of one rank's per rank
    # (a block 3 * 98304 FLOPs per token forward + backward, the head 3 * 32768)
    assert kernels.block_gemm_s(TINY, 1024, "float32", PEAK, False, tp=2) == pytest.approx(
        3 * 98304 * 1024 / 2 / 1e11
    )
    assert kernels.head_gemm_s(TINY, 1024, 256, "float32", PEAK, tp=2) == pytest.approx(
        3 * 32768 * 1024 / 2 / 1e11
    )


def test_tp_gemms_use_the_rate_of_the_per_rank_shape():
    from toolkit.config.hardware import GemmPoint

    hw = HardwareConfig(
        peak_flops_fp32=1e11,
        matmul=[GemmPoint(1024, 96, 64, "float32", 0.5), GemmPoint(1024, 192, 64, "float32", 1.0)],
    )
    # the qkv forward on 2 ranks is (1024, 96, 64): 2*1024*96*64 FLOPs at half the peak
    assert kernels.gemm_seconds(1024, 96, 64, "float32", hw) == pytest.approx(
        2 * 1024 * 96 * 64 / 5e10
    )


def test_tp_collectives_per_micro_step_with_sequence_parallelism():
    c = tp.collectives(
        TINY, blocks=2, embedding=True, head=True, tokens=1024, act_bytes=4, tp=2, recompute=False
    )
    # per block 4 forward (AG, RS around attention and MLP) + 4 backward; embedding RS + AG;
    # head AG + RS: 2*8 + 2 + 2 = 20 calls of 1024*64*4 B * (2-1)/2 = 131072 B
    assert c["calls"] == 20
    assert c["bytes"] == 20 * 131072
    # loss parallel: 2 all-reduces of 1024 fp32, each 2*(1/2)*4096 B
    assert (c["allreduce_calls"], c["allreduce_bytes"]) == (2, 8192)
    with_ac = tp.collectives(
        TINY, blocks=2, embedding=False, head=False, tokens=1024, act_bytes=4, tp=2, recompute=True
    )
    assert with_ac["calls"] == 2 * 12  # the recomputed forward's 4 again
    assert tp.collectives(
        TINY, blocks=2, embedding=True, head=True, tokens=1024, act_bytes=4, tp=1, recompute=False
    ) == {"calls": 0, "bytes": 0.0, "allreduce_calls": 0, "allreduce_bytes": 0.0}
    # seconds: every call pays its latency, nothing overlaps
    # (a 2-rank group in one node: ring, no per-step latency on the CPU-like link)
    group = comm.Span(ranks=2, ranks_per_node=2, bus_bandwidth=1e9, call_latency_s=1e-5)
    assert tp.collectives_s(c, group) == pytest.approx(22 * 1e-5 + (20 * 131072 + 8192) / 1e9)


def test_tp_collectives_are_on_the_critical_path_of_the_step():
    hw = dataclasses.replace(PEAK, intra_node_bandwidth=1e9, intra_node_latency_s=1e-5)
    lay = Layout(world_size=2, ranks_per_node=2, micro_batch_size=8, grad_accum=2, seq_len=128)
    p = predict(TINY, dataclasses.replace(lay, tp=2), hw)
    # two micro-steps of 22 calls each (above), all exposed
    assert p.time["tp_communication_s"] == pytest.approx(2 * (22e-5 + (20 * 131072 + 8192) / 1e9))
    assert predict(TINY, lay, hw).time["tp_communication_s"] == 0.0


def test_tp_across_nodes_takes_the_inter_node_link():
    hw = dataclasses.replace(
        PEAK, intra_node_bandwidth=1e10, inter_node_bandwidth=1e8, inter_node_latency_s=1e-4
    )
    inside = Layout(4, 4, 8, 1, 128, tp=4)
    across = dataclasses.replace(inside, ranks_per_node=2)
    assert inside.tp_within_node and not across.tp_within_node
    t_in = predict(TINY, inside, hw).time["tp_communication_s"]
    t_across = predict(TINY, across, hw).time["tp_communication_s"]
    assert t_across > 10 * t_in
    assert (
        communication(TINY, across)["inter_node_bytes"] >= communication(TINY, across)["tp_bytes"]
    )


def test_sequence_parallel_activations():
    # 9 + 2r without tp; with tp the two all-gathered norm outputs stay whole: 2 + (7+2r)/tp
    assert tp.block_activation_units(4, 1) == 17
    assert tp.block_activation_units(4, 2) == 2 + 15 / 2


def test_memory_with_tp_2_and_fsdp_2():
    lay = Layout(world_size=4, ranks_per_node=4, micro_batch_size=8, grad_accum=1, seq_len=128)
    m = memory(TINY, dataclasses.replace(lay, tp=2))
    # the tp-local 82560 parameters sharded over dp_shard = 4 / 2 = 2: 82560 * 4 B / 2
    assert m["params_bytes"] == 165120
    assert m["optimizer_bytes"] == 2 * 165120
    # activations: 2 blocks x 9.5 units + final norm in/out split 2 ways (1 unit) = 20 units
    assert m["activations_bytes"] == 20 * UNIT
    # the loss over vocabulary / tp = 128 logits per token, 12 B each
    assert m["logits_bytes"] == 1024 * 128 * 12


# -- pipeline parallelism ----------------------------------------------------------------
def test_bubble_fraction_per_schedule():
    # GPipe and 1F1B: (p-1)/(m+p-1); interleaved: the bubble's (p-1) stage-times / v
    assert pipeline.bubble_fraction("gpipe", 4, 8) == 3 / 11
    assert pipeline.bubble_fraction("1f1b", 4, 8) == 3 / 11
    assert pipeline.bubble_fraction("interleaved_1f1b", 4, 8, 2) == 3 / 19
    assert pipeline.bubble_fraction("1f1b", 1, 8) == 0.0
    # step: (m + (p-1)/v) stage-times = m stage-times / (1 - bubble)
    assert pipeline.pipeline_s(1.0, "1f1b", 4, 8) == 11.0
    assert pipeline.pipeline_s(1.0, "interleaved_1f1b", 4, 8, 2) == 9.5
    assert pipeline.pipeline_s(1.0, "gpipe", 4, 8) == pytest.approx(8 / (1 - 3 / 11))


def test_micro_batches_in_flight_per_schedule():
    assert pipeline.in_flight("gpipe", 4, 8, 1, 0) == 8  # every forward before any backward
    assert pipeline.in_flight("1f1b", 4, 8, 1, 0) == 4  # first stage: p
    assert pipeline.in_flight("1f1b", 4, 8, 1, 3) == 1  # last stage: 1
    assert pipeline.in_flight("1f1b", 4, 2, 1, 0) == 2  # never more than m
    # interleaved, v = 2: (2(p-1) + (v-1)p + 1) chunks = 11 chunks = 5.5 micro-batches,
    # p(1 + (p-1)/(p v)) = 4 * 11/8 (Korthikanti et al. 2022)
    assert pipeline.in_flight("interleaved_1f1b", 4, 8, 2, 0) == 5.5 == 4 * (1 + 3 / 8)


def test_p2p_bytes_per_micro_batch_and_boundary():
    assert pipeline.p2p_bytes(2, 128, 64, 2) == 2 * 128 * 64 * 2
    assert pipeline.p2p_bytes(2, 128, 64, 2, tp=2) == 2 * 128 * 64  # a sequence shard each
    lay = Layout(2, 2, 8, 4, 128, pp=2)
    c = communication(TINY, lay)
    # 4 micro-batches, forward out + gradient back: 8 sends of 1024 * 64 * 4 B
    assert (c["p2p_calls"], c["p2p_bytes"]) == (8, 8 * UNIT)


def test_layer_costs_and_balanced_split():
    costs = layer_costs(TINY, 128, PEAK, micro_batch_size=8)
    assert len(costs) == TINY.num_layers + 2  # embedding, blocks, head + loss
    assert costs[1] == costs[2] > 0 and costs[-1] > 0
    # a block: its GEMMs (3 x 2 x 1024 x 49152 FLOPs) + attention + bytes + ops at PEAK's
    # defaults; the head's GEMMs alone are 3 x 2 x 1024 x 64 x 256 FLOPs
    assert costs[-1] > 3 * 2 * 1024 * 64 * 256 / 1e11
    assert balanced_split([5, 1, 1, 1, 1, 1, 1, 5], 2) == [3, 3]
    # the embedding's cost 4 weighs on the first stage: 4 + 1 = 5 against 5 blocks
    assert balanced_split([4, 1, 1, 1, 1, 1, 1, 0], 2) == [1, 5]
    assert balanced_split([0, 1, 1, 1, 1, 0], 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError):
        balanced_split([0, 1, 1, 0], 3)
    # interleaved order: rank r runs stages r, r + p, ...
    stages = pipeline.rank_stages([1, 2, 3, 4], 2)
    assert [(s.blocks, s.embedding, s.head) for s in stages] == [(4, True, False), (6, False, True)]


def test_memory_per_pipeline_stage():
    one_f_one_b = Layout(world_size=2, ranks_per_node=2, micro_batch_size=8, grad_accum=4,
                         seq_len=128, pp=2, pp_split=(1, 1))  # fmt: skip
    m = memory(TINY, one_f_one_b)
    first, last = m["stage_peaks_bytes"]
    # first stage: embedding + 1 block = 32768 + 49408 parameters, unsharded (dp = 1)
    s0 = pipeline.Stage(0, 1, True, False)
    from toolkit.perfmodel.memory import stage_memory

    m0 = stage_memory(TINY, one_f_one_b, s0, float("inf"))
    assert m0["params_bytes"] == (32768 + 49408) * 4
    # 1F1B: the first stage holds min(m, p) = 2 micro-batches of its block: 2 x 17 units
    assert m0["activations_bytes"] == 2 * 17 * UNIT
    assert m0["logits_bytes"] == 0  # the head is on the last stage
    m1 = stage_memory(TINY, one_f_one_b, pipeline.Stage(1, 1, False, True), float("inf"))
    # last stage: 1 micro-batch of (17 + final norm 2) units, one micro-batch's logits
    assert m1["activations_bytes"] == 19 * UNIT
    assert m1["logits_bytes"] == 1024 * 256 * 12
    assert (first, last) == (m0["peak_bytes"], m1["peak_bytes"])
    # GPipe holds all 4 micro-batches on every stage, and the loss of all 4 on the last
    gpipe = stage_memory(
        TINY, dataclasses.replace(one_f_one_b, pp_schedule="gpipe"), s0, float("inf")
    )
    assert gpipe["activations_bytes"] == 4 * 17 * UNIT


def test_pipeline_step_is_the_slowest_stage_times_m_plus_the_bubble():
    hw = dataclasses.replace(PEAK, fsdp_collective_overhead_s=0.0)
    lay = Layout(2, 2, 8, 4, 128, pp=2, pp_split=(1, 1))
    p = predict(TINY, lay, hw)
    stages = pipeline.layout_stages(TINY, lay, hw)
    per_mb = [stage_time(TINY, lay, hw, s)["micro_batch_s"] for s in stages]
    assert p.time["stage_micro_batch_s"] == per_mb
    critical = per_mb[p.time["critical_stage"]]
    # (m + p - 1) x the slowest stage's micro-batch; the critical rank idles the rest
    assert p.time["pipeline_bubble_s"] == pytest.approx((4 + 1) * max(per_mb) - 4 * critical)
    assert p.time["bubble_fraction"] == 1 / 5
    total = sum(float(p.time[f"{t}_s"]) for t in (
        "gemm", "attention", "elementwise", "overhead", "fsdp_copy", "communication",
        "optimizer", "tp_communication", "pipeline_p2p", "pipeline_bubble"))  # fmt: skip
    assert p.step_s == pytest.approx(total)
    assert p.tokens_per_step == 8 * 4 * 1 * 128  # dp = 1: both ranks share the batch


# -- from a job --------------------------------------------------------------------------
def test_layout_from_job_reads_the_mesh_degrees():
    job = to_job(
        compose_raw(
            [
                "model=gpt_tiny",
                "cluster.tasks_per_node=8",
                "parallel.tp=2",
                "parallel.pp=2",
                "parallel.pp_schedule=gpipe",
                "trainer.grad_accum=2",
            ]
        )
    )
    lay = layout_from_job(job)
    assert (lay.world_size, lay.tp, lay.pp, lay.dp, lay.shard_size) == (8, 2, 2, 2, 2)
    assert lay.pp_schedule == "gpipe"
    assert predict(job.model, lay, job.hardware).step_s > 0


def test_a_pipeline_that_does_not_fit_names_its_rank_and_largest_term():
    big_vocab = dataclasses.replace(TINY, vocab_size=4096)
    lay = Layout(2, 2, 64, 4, 256, pp=2, pp_schedule="gpipe", pp_split=(1, 1))
    p = predict(big_vocab, lay, HardwareConfig(memory_bytes=2**20))
    assert not p.fits and p.tokens_per_s == 0.0
    # GPipe: the last rank holds the loss working set of all 4 micro-batches:
    # 4 x 64 x 256 tokens x 4096 logits x 12 B = 3 GiB (its activations: 4 x 19 units of
    # 16384 x 64 x 4 B = 0.30 GiB)
    assert p.does_not_fit().startswith("does not fit: peak ")
    assert " on pipeline rank 1 > " in p.does_not_fit()
    assert p.does_not_fit().endswith("largest term logits 3.00 GiB")


def test_the_prediction_says_which_link_tp_and_pp_take():
    across = predict(TINY, Layout(8, 2, 8, 4, 128, tp=4, pp=2), PEAK)
    assert (across.time["tp_link"], across.time["pp_link"]) == ("inter-node", "inter-node")
    inside = predict(TINY, Layout(8, 8, 8, 4, 128, tp=4, pp=2), PEAK)
    assert (inside.time["tp_link"], inside.time["pp_link"]) == ("intra-node", "intra-node")
    assert predict(TINY, Layout(2, 2, 8, 1, 128), PEAK).time["tp_link"] == "-"
