"""The step-time terms, each checked by hand on a tiny shape (toolkit.perfmodel.kernels,
toolkit.perfmodel.comm) and the does-not-fit verdict."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.config.hardware import GemmPoint, HardwareConfig
from toolkit.config.model import GPTConfig
from toolkit.perfmodel import Layout, comm, kernels, predict
from toolkit.train.flops import block_params, param_counts

TINY = GPTConfig(name="gpt_tiny", num_layers=2, dim=64, num_heads=4, vocab_size=256)
PEAK = HardwareConfig(peak_flops_fp32=1e11, matmul=[])  # no table: fraction 1


def test_matmul_fraction_is_the_nearest_measured_shape_in_log_space():
    hw = HardwareConfig(
        matmul=[GemmPoint(64, 64, 64, "float32", 0.5), GemmPoint(1024, 1024, 1024, "float32", 0.9)]
    )
    assert hw.matmul_fraction(100, 100, 100, "float32") == 0.5
    assert hw.matmul_fraction(600, 600, 600, "float32") == 0.9  # ln 600 is nearer ln 1024
    # 2*4*8*16 = 1024 FLOPs at 1e11 * 0.5 FLOP/s
    assert kernels.gemm_seconds(4, 8, 16, "float32", hw) == pytest.approx(1024 / 5e10)
    assert PEAK.matmul_fraction(5, 5, 5, "float32") == 1.0


def test_gemm_time_counts_forward_backward_and_recompute():
    # forward GEMM FLOPs per token: a block 2 * (4*64^2 + 2*64*256) = 98304, the head
    # 2 * 64*256 = 32768; backward twice the forward: x3. 1024 tokens at 1e11 FLOP/s
    assert kernels.block_gemm_s(TINY, 1024, "float32", PEAK, False) == pytest.approx(
        3 * 98304 * 1024 / 1e11
    )
    assert kernels.head_gemm_s(TINY, 1024, 256, "float32", PEAK) == pytest.approx(
        3 * 32768 * 1024 / 1e11
    )
    # checkpointing adds the block's forward (the head is never recomputed)
    assert kernels.block_gemm_s(TINY, 1024, "float32", PEAK, True) == pytest.approx(
        4 * 98304 * 1024 / 1e11
    )


def test_causal_attention_executes_half_of_full_attention():
    # full: 12 * L * d * S per token = 12*2*64*128 = 196608; causal half, 1024 tokens
    assert kernels.causal_attention_flops(TINY, 1024, 128) == 98304 * 1024


def test_non_gemm_kernels_are_charged_by_bytes():
    assert kernels.cross_entropy_bytes_per_logit(4) == 20  # log_softmax 8 + backward 12
    assert kernels.cross_entropy_bytes_per_logit(2) == 32  # + casts 2*(2+4)
    # unit = 1024 tokens * 64 * 4 B = 262144; a block moves 20 units forward, 40 backward:
    # 60 units = 15728640; embedding 7 units + 2*256*64*4 = 1966080;
    # final norm 6 units = 1572864 and the loss 1024*256*20 = 5242880
    assert kernels.block_elementwise_bytes(TINY, 1024, 4, False) == 15728640
    assert kernels.embedding_elementwise_bytes(TINY, 1024, 256, 4) == 1966080
    assert kernels.head_elementwise_bytes(TINY, 1024, 256, 4) == 1572864 + 5242880


def test_optimizer_traffic_is_what_foreach_adamw_and_clipping_move():
    assert kernels.optimizer_bytes(1000) == (22 + 3) * 4 * 1000


def test_fsdp_copies_move_gather_and_reduce_buffers_even_on_one_rank():
    # 2 blocks of 300 params + a root of 400, fp32, 2 ranks, resharded: the second block's
    # forward gather is redone in backward -> 1300 gathered; copy-in (4 + 4) / 2 per gathered
    # element, copy-out 2 * 4; reduce: chunk_cat 4 + 4, the shard to fp32 (4 + 4) / 2
    fp32 = comm.fsdp_copy_bytes(
        total=1000, block=300, blocks=2, shard_size=2, grad_accum=1,
        param_dtype="float32", reduce_dtype="float32", reshard_after_forward=True,
    )  # fmt: skip
    assert fp32 == 1300 * (4 + 8) + 1000 * (8 + 4)
    # bf16 compute, one rank, 2 micro-steps, kept gathers: 2000 gathered at (4 + 2) + 2 * 2,
    # reduce at (2 + 4) + (4 + 4), and one accumulation of the unsharded gradient in fp32
    # (read 2 + 4, write 4)
    mixed = comm.fsdp_copy_bytes(
        total=1000, block=300, blocks=2, shard_size=1, grad_accum=2,
        param_dtype="bfloat16", reduce_dtype="float32", reshard_after_forward=False,
    )  # fmt: skip
    assert mixed == 2000 * (6 + 4) + 1000 * (6 + 8) + 1000 * (2 + 8)


def test_the_fsdp_copy_term_is_its_bytes_at_the_copy_rate_and_counts_as_compute():
    layout = Layout(world_size=1, ranks_per_node=1, micro_batch_size=8, grad_accum=1, seq_len=128)
    full = predict(TINY, layout, dataclasses.replace(PEAK, memory_bandwidth=1e10))
    slow = predict(
        TINY, layout, dataclasses.replace(PEAK, memory_bandwidth=1e10, fsdp_copy_fraction=0.25)
    )
    moved = comm.fsdp_copy_bytes(
        total=param_counts(TINY)["total"], block=block_params(TINY.dim, TINY.mlp_ratio),
        blocks=2, shard_size=1, grad_accum=1, param_dtype="float32",
        reduce_dtype="float32", reshard_after_forward=True,
    )  # fmt: skip
    assert full.time["fsdp_copy_s"] == pytest.approx(moved / 1e10)
    assert slow.time["fsdp_copy_s"] == pytest.approx(4 * moved / 1e10)
    added = slow.time["fsdp_copy_s"] - full.time["fsdp_copy_s"]
    assert slow.step_s - full.step_s == pytest.approx(added)
    assert slow.time["compute_s"] - full.time["compute_s"] == pytest.approx(added)


def test_cpu_ranks_share_the_cores():
    cpu = HardwareConfig(cores_per_node=2, thread_efficiency=0.25)
    assert kernels.rank_speed(cpu, 1) == 2 * 0.25  # 2 threads at the measured efficiency
    assert kernels.rank_speed(cpu, 2) == 1.0
    assert kernels.rank_speed(cpu, 4) == 0.5  # 4 ranks on 2 cores
    assert kernels.overhead_slowdown(cpu, 2) == 1.0
    threaded = HardwareConfig(cores_per_node=2, op_overhead_s=1e-5, threaded_op_overhead_s=4e-5)
    assert kernels.overhead_slowdown(threaded, 1) == 4.0  # one rank, 2 threads per op
    assert kernels.overhead_slowdown(cpu, 4) == 2.0
    assert kernels.rank_speed(HardwareConfig(cores_per_node=0), 8) == 1.0  # GPU


def test_inter_node_bandwidth_is_per_nic_times_rails():
    rails = HardwareConfig(inter_node_bandwidth=50e9, nics_per_node=8)
    assert comm.inter_node_bandwidth_per_rank(rails, 8) == 50e9
    one_nic = HardwareConfig(inter_node_bandwidth=50e9, nics_per_node=1)
    assert comm.inter_node_bandwidth_per_rank(one_nic, 8) == 50e9 / 8


def test_first_gather_and_last_reduce_are_exposed_and_the_rest_hides_behind_compute():
    c = {
        "allgather_bytes": 1e6,
        "allgather_calls": 10,
        "first_allgather_bytes": 1e5,
        "first_allgather_calls": 2,
        "reduce_scatter_bytes": 1e6,
        "reduce_scatter_calls": 5,
        "last_reduce_scatter_bytes": 1e5,
        "replica_allreduce_bytes": 0.0,
        "replica_allreduce_calls": 0,
        "small_allreduce_calls": 2,
    }
    group = comm.Span(ranks=2, ranks_per_node=2, bus_bandwidth=1e9, call_latency_s=1e-5)
    link = comm.Links(shard=group, replica=group, world=group)
    t = comm.communication_time(c, link, compute_s=1e-3, overlap=1.0)
    # all-gather 10 * 1e-5 + 1e6 / 1e9 = 1.1 ms; reduce-scatter 5e-5 + 1e-3 = 1.05 ms
    # first 2e-5 + 1e-4 = 0.12 ms; last 1e-5 + 1e-4 = 0.11 ms; the rest 1.92 ms, 1 ms hidden;
    # the two small all-reduces of one fp32: 2 * (1e-5 + 4 B * 2 * 1/2 / 1e9)
    assert t["total_s"] == pytest.approx(2.15e-3 + 2e-5 + 8e-9)
    assert t["exposed_s"] == pytest.approx(0.23e-3 + 0.92e-3)
    assert comm.communication_time(c, link, 1e-3, overlap=0.0)["exposed_s"] == pytest.approx(
        2.15e-3
    )


def test_a_layout_that_does_not_fit_has_no_throughput_and_names_its_largest_term():
    layout = Layout(world_size=1, ranks_per_node=1, micro_batch_size=64, grad_accum=1, seq_len=256)
    p = predict(TINY, layout, HardwareConfig(memory_bytes=2**20))
    assert not p.fits
    assert p.tokens_per_s == 0.0
    assert p.does_not_fit().startswith("does not fit: peak ")
    assert "largest term activations" in p.does_not_fit()


def test_mfu_counts_model_flops_and_hfu_executed_flops():
    layout = Layout(2, 2, 8, 1, 128, activation_checkpointing=True)
    p = predict(TINY, layout, PEAK)
    u = p.utilisation(1e11)
    assert u["mfu"] == pytest.approx(p.flops["model_flops_per_step"] / (p.step_s * 2 * 1e11))
    assert u["hfu"] == pytest.approx(p.flops["executed_flops_per_step"] / (p.step_s * 2 * 1e11))


def test_the_step_range_follows_the_stated_uncertainty():
    p = predict(TINY, Layout(2, 2, 8, 1, 128), dataclasses.replace(PEAK, uncertainty=0.5))
    low, high = p.step_range_s()
    assert (low, high) == (pytest.approx(p.step_s / 1.5), pytest.approx(p.step_s * 1.5))


def test_the_split_regroups_the_terms_as_a_step_record_measures_them():
    from toolkit.perfmodel.split import predicted_split

    time = {
        "compute_s": 1.0,
        "communication_s": 0.2,
        "tp_communication_s": 0.03,
        "pipeline_p2p_s": 0.004,
        "pipeline_bubble_s": 0.5,
        "small_allreduce_s": 0.01,
        "optimizer_s": 0.11,  # includes the small all-reduces (loss, grad norm)
        "data_wait_s": 0.0,
        "step_s": 1.844,
    }
    split = predicted_split(time)
    assert split["compute"] == 1.0
    # FSDP2 exposed + tp + p2p + bubble + the small all-reduces moved out of the optimizer
    assert split["exposed_communication"] == pytest.approx(0.2 + 0.03 + 0.004 + 0.5 + 0.01)
    assert split["optimizer"] == pytest.approx(0.1)
    assert split["checkpoint_stall"] == 0.0 and split["step"] == 1.844
    parts = ("compute", "exposed_communication", "optimizer", "data_wait", "checkpoint_stall")
    assert sum(split[p] for p in parts) == pytest.approx(split["step"])


def test_an_async_checkpoint_stalls_the_loop_for_its_staging_copy_once_per_interval():
    from toolkit.config.job import JobConfig
    from toolkit.perfmodel.job import checkpoint_stall_s, predict_job

    job = JobConfig()
    job.hardware.host_device_bandwidth = 1e9
    assert checkpoint_stall_s(job, 4e9) == 0.0  # checkpointing off
    job.checkpoint.enabled, job.checkpoint.interval_steps = True, 10
    assert checkpoint_stall_s(job, 4e9) == pytest.approx(4e9 / 1e9 / 10)  # 4 s every 10 steps
    p = predict_job(job, 1)
    state = p.memory["params_bytes"] + p.memory["optimizer_bytes"]
    assert p.time["checkpoint_stall_s"] == pytest.approx(state / 1e9 / 10)
    job.checkpoint.enabled = False
    assert p.step_s == pytest.approx(predict_job(job, 1).step_s + state / 1e9 / 10)
