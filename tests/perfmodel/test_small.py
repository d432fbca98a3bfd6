"""The small-model regime (toolkit.perfmodel.small, regime): the launch floor, the packing
effect (K members: one floor, K times the arithmetic), the data paths' rates and the advice
with the term that bounds the step. Numbers checked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from toolkit.config.compose import job_or_none
from toolkit.perfmodel import kernels, small
from toolkit.perfmodel.job import fused_optimizer, layout_from_job, predict_job
from toolkit.perfmodel.model import predict
from toolkit.perfmodel.regime import DEVICE_PATH, regime

SMALL_GPU = ["model=ts_transformer", "data=returns", "hardware=h100", "precision=bf16"]

# A step's terms as toolkit.perfmodel.steptime.step_time writes them (ms): floor = overhead
# 3.0 (1.0 of it FSDP2's per-unit cost) + the optimizer's launches 0.5; the rest, 1.1, is one
# member's work (0.05 of it FSDP2's copies).
TIME = {
    "gemm_s": 0.6e-3,
    "attention_s": 0.1e-3,
    "elementwise_s": 0.2e-3,
    "overhead_s": 3.0e-3,
    "fsdp_copy_s": 0.05e-3,
    "communication_s": 0.05e-3,
    "optimizer_s": 0.5e-3 + 0.1e-3,
    "optimizer_launch_s": 0.5e-3,
    "tp_communication_s": 0.0,
    "pipeline_p2p_s": 0.0,
    "pipeline_bubble_s": 0.0,
    "compute_s": 3.95e-3,
    "communication_total_s": 0.1e-3,
    "forward_backward_s": 4.0e-3,
    "step_s": 4.6e-3,
    "launches": 300.0,
    "fsdp_overhead_s": 1.0e-3,
    "dominant": "overhead",
}


def test_the_floor_is_the_overhead_term_and_the_optimizers_launches():
    s = small.split(TIME)
    assert s.floor_s == pytest.approx(3.5e-3)
    assert s.member_s == pytest.approx(1.1e-3)
    assert s.launches == 300
    assert s.overhead_share == pytest.approx(3.5 / 4.6)
    # an ensemble is not sharded: no FSDP2 per-unit cost, no copies
    assert s.ensemble_floor_s == pytest.approx(2.5e-3)
    assert s.ensemble_member_s == pytest.approx(1.05e-3)


def test_k_members_pay_one_floor_and_k_times_the_arithmetic():
    t = small.packed_time(TIME, 4)
    assert t["overhead_s"] == pytest.approx(2.0e-3)  # once, without FSDP2's per-unit cost
    assert t["fsdp_copy_s"] == 0.0
    assert t["gemm_s"] == pytest.approx(4 * 0.6e-3)
    assert t["optimizer_s"] == pytest.approx(0.5e-3 + 4 * 0.1e-3)  # launches once, bytes 4x
    assert t["step_s"] == pytest.approx(2.5e-3 + 4 * 1.05e-3)
    assert t["forward_backward_s"] == pytest.approx(t["step_s"] - t["optimizer_s"])
    assert t["dominant"] == "gemm" and t["ensemble"] == 4  # 2.4 ms of GEMMs > 2.0 ms
    assert small.packed_time(TIME, 1) == TIME


def test_packing_balances_the_floor_where_the_members_arithmetic_reaches_it():
    s = small.split(TIME)  # packed: 2.5 ms floor, 1.05 ms per member: 2.38 -> 3 members
    assert small.balance_ensemble(s) == 3
    assert small.balance_ensemble(small.StepSplit(4e-3, 1e-3, 1)) == 4  # exactly reached
    assert small.balance_ensemble(small.StepSplit(1e-3, 2e-3, 1)) == 1  # compute-bound
    assert small.memory_ensemble(peak_bytes=3e9, capacity_bytes=80e9) == 26
    assert small.memory_ensemble(peak_bytes=90e9, capacity_bytes=80e9) == 0


def test_a_packed_prediction_scales_flops_tokens_and_memory():
    job = job_or_none(SMALL_GPU, [])
    one = predict(job.model, layout_from_job(job), job.hardware)
    eight = small.packed(one, 8)
    assert eight.tokens_per_step == 8 * one.tokens_per_step
    assert eight.flops["model_flops_per_step"] == 8 * one.flops["model_flops_per_step"]
    assert eight.memory["peak_bytes"] == 8 * one.memory["peak_bytes"]
    assert eight.memory["capacity_bytes"] == one.memory["capacity_bytes"]
    s = small.split(one.time)
    assert eight.step_s == pytest.approx(s.ensemble_floor_s + 8 * s.ensemble_member_s)
    # 8 members in one step beat 8 separate steps by the floors saved.
    assert 8 * one.step_s / eight.step_s == pytest.approx(8 * s.step_s(1) / s.step_s(8))


def test_trainer_ensemble_is_packed_in_the_jobs_prediction():
    one = predict_job(job_or_none(SMALL_GPU, []))
    four = predict_job(job_or_none([*SMALL_GPU, "trainer.ensemble=4"], []))
    s = small.split(one.time)
    assert four.step_s == pytest.approx(s.step_s(4))


def test_gpu_optimizer_launches_count_multi_tensor_chunks_and_fused_adamw():
    # 37 tensors (ts_transformer: 4 blocks x 8 + 5): 2 chunks of at most 36 per launch.
    assert kernels.optimizer_launches(37, 1e6, gpu=True) == 13 * 2
    assert kernels.optimizer_launches(37, 1e6, gpu=True, fused=True) == 4 * 2
    assert kernels.optimizer_launches(37, 1e6, gpu=False) == 13 * 37  # CPU: per tensor
    # 320 blocks x 65536 elements per launch: 100 M parameters in 5 chunks.
    assert kernels.optimizer_launches(10, 100e6, gpu=True, fused=True) == 4 * 5
    assert kernels.optimizer_bytes(1000, fused=True) == (7 + 3) * 4 * 1000


def test_fused_adamw_is_assumed_where_the_ranks_run_it():
    assert fused_optimizer(job_or_none(SMALL_GPU, []))  # auto on a GPU preset
    assert not fused_optimizer(job_or_none(["hardware=cpu"], []))  # auto on CPU: foreach
    assert not fused_optimizer(job_or_none([*SMALL_GPU, "optim.fused=off"], []))


def test_the_micro_batch_that_balances_the_floor_is_the_first_doubling_that_does():
    job = job_or_none(SMALL_GPU, [])
    layout = layout_from_job(job)

    def at(b):
        return predict(job.model, replace(layout, micro_batch_size=b), job.hardware)

    b = small.balance_micro_batch(at, layout.micro_batch_size)
    assert b is not None and b > layout.micro_batch_size
    reached, before = small.split(at(b).time), small.split(at(b // 2).time)
    assert reached.member_s >= reached.floor_s and before.member_s < before.floor_s


def test_the_device_gather_rate_is_its_bytes_read_and_written_at_the_elementwise_rate():
    per_sample = small.window_bytes(seq_len=64, inputs=48, targets=16)
    assert per_sample == (64 * 48 + 16) * 4
    rate = small.device_gather_rate(per_sample, memory_bandwidth=3.35e12, fraction=0.7)
    assert rate == pytest.approx(3.35e12 * 0.7 / (2 * 12352))


def test_bench_data_rates_take_each_paths_best_row():
    result = {
        "results": [
            {"format": "npy", "workers": 0, "samples_per_s": 12_500.0},
            {"format": "npy", "workers": 2, "samples_per_s": 9_000.0},
            {"format": "hdf5", "workers": 1, "samples_per_s": float("nan")},
        ]
    }
    assert small.bench_data_rates(result) == {"loader": 12_500.0}
    on_gpu = {
        "results": [],
        "paths": {
            "device": "cuda",
            "median_samples_per_s": {
                "host_loader": 11_000.0,
                "device_resident": 900_000.0,
                "gather_bound": 1_000_000.0,
            },
        },
    }
    assert small.bench_data_rates(on_gpu) == {"loader": 11_000.0, DEVICE_PATH: 900_000.0}
    on_cpu = {"paths": {"device": "cpu", "median_samples_per_s": {"device_resident": 190e3}}}
    assert small.bench_data_rates(on_cpu) == {"device-resident, on cpu": 190e3}
    assert small.bench_data_rates({"no": "results"}) == {}


def test_overhead_bound_advice_names_the_ensemble_and_the_micro_batch():
    s = small.StepSplit(floor_s=4e-3, member_s=0.2e-3, launches=287)
    a = small.advise(s, 8, 8, max_members=100, balance_b=512, rates={"loader": 12_500.0})
    assert (a.bound, a.ensemble, a.micro_batch_size, a.data_path) == ("overhead", 20, 512, "loader")
    assert a.line == (
        "overhead-bound: the launch floor (4.00 ms: 287 launches) is 20x one model's "
        "arithmetic (0.20 ms at micro-batch 8); pack 20 members (trainer.ensemble=20; a -m "
        "sweep: launch.pack=auto) or raise the micro-batch to 512"
    )
    assert a.needed_samples_per_s == pytest.approx(8 / (4e-3 + 20 * 0.2e-3))


def test_memory_caps_the_members_and_says_so():
    s = small.StepSplit(floor_s=4e-3, member_s=0.2e-3, launches=287)
    a = small.advise(s, 8, 8, max_members=5, balance_b=None, rates={})
    assert a.ensemble == 5
    assert "as many as fit in memory (20 would balance)" in a.line


def test_a_data_path_slower_than_the_step_bounds_it():
    s = small.StepSplit(floor_s=1e-3, member_s=2e-3, launches=100)
    a = small.advise(s, 4096, 4096, max_members=10, balance_b=4096, rates={"loader": 12_500.0})
    assert a.bound == "data"
    assert a.line == (
        "data-bound: a step of 3.00 ms needs 1,365,333 samples/s per rank; the fastest data "
        "path measured, loader, delivers 12,500"
    )


def test_arithmetic_bound_when_one_model_outweighs_the_floor():
    a = small.advise(small.StepSplit(1e-3, 5e-3, 100), 8, 8, 10, 8, {})
    assert a.bound == "arithmetic" and a.ensemble == 1


def test_a_small_model_on_an_h100_is_overhead_bound_and_the_device_path_keeps_up():
    r = regime(job_or_none(SMALL_GPU, []), measured={"loader": 12_500.0})
    assert r.advice.bound == "overhead"
    assert r.split.overhead_share > 0.9  # the GPU idles between kernels
    assert r.advice.ensemble == small.balance_ensemble(r.split)
    assert r.advice.data_path == DEVICE_PATH
    assert any(line.startswith("launch floor: ") for line in r.lines)
    assert r.lines[-1] == r.advice.line


def test_an_ensemble_that_does_not_fit_is_refused_naming_the_members():
    from toolkit.perfmodel.job import memory_problems

    job = job_or_none(["model=gpt_small", "trainer.ensemble=5000"], [])
    (line,) = memory_problems(job, 2)
    assert line.startswith("trainer.ensemble=5000 with trainer.micro_batch_size=8: does not fit")
    assert "pack fewer members (trainer.ensemble)" in line
    assert memory_problems(job_or_none(["model=gpt_small", "trainer.ensemble=2"], []), 2) == []
