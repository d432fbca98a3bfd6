"""Benchmark statistics on hand-made step records."""

from __future__ import annotations

import pytest

from toolkit.measure.stats import (
    measured_split,
    scaling_efficiency,
    step_statistics,
    steps_by_number,
    time_to_target,
)


def record(step: int, step_time: float, rank: int = 0, **kw) -> dict:
    base = {
        "step": step,
        "wall_time": 1000.0 + step,
        "step_time_s": step_time,
        "data_wait_s": 0.1 * step_time,
        "forward_backward_s": 0.7 * step_time,
        "optimizer_s": 0.2 * step_time,
        "loss": 5.0 - 0.1 * step,
        "tokens": 1000,
        "mem_peak_bytes": 100 + step,
        "rank": rank,
    }
    return base | kw


def test_a_step_lasts_as_long_as_its_slowest_rank():
    merged = steps_by_number([[record(1, 0.5)], [record(1, 0.8, rank=1)]])
    assert merged[0]["step_time_s"] == 0.8


def test_warmup_is_excluded_and_percentiles_cover_the_measured_steps():
    # steps 1-2 are slow warm-up; measured steps 3..12 take 1.0, 1.1, ..., 1.9 s
    steps = [record(1, 9.0), record(2, 5.0)] + [record(3 + i, 1.0 + 0.1 * i) for i in range(10)]
    s = step_statistics(steps, 2, world_size=2, flops_per_token=6.0, peak_flops=1000.0)
    assert s["measured_steps"] == 10
    assert s["step_time_s_median"] == pytest.approx(1.45)
    assert s["step_time_s_p10"] == pytest.approx(1.09)  # numpy linear interpolation
    assert s["step_time_s_p90"] == pytest.approx(1.81)
    assert s["tokens_per_s"] == pytest.approx(1000 / 1.45)
    assert s["tokens_per_s_per_device"] == pytest.approx(1000 / 1.45 / 2)
    assert s["mfu"] == pytest.approx(1000 / 1.45 * 6.0 / (1000.0 * 2))
    assert s["data_wait_share"] == pytest.approx(0.1)
    assert s["measured_dominant"] == "forward_backward_s"
    assert s["peak_memory_bytes"] == 112  # over all steps, warm-up included


def test_no_measured_steps_is_an_error_naming_the_warmup():
    with pytest.raises(ValueError, match="warm-up excludes the first 5"):
        step_statistics([record(1, 1.0)], 5, world_size=1, flops_per_token=1, peak_flops=1)


def test_time_to_target_is_the_first_eval_at_or_below_target():
    steps = [record(i, 1.0) for i in range(1, 11)]  # first step started at t=1000
    evals = [
        {"step": 4, "end": 1004.5, "attrs": {"val_loss": 3.0}},
        {"step": 8, "end": 1008.5, "attrs": {"val_loss": 2.4}},
        {"step": 10, "end": 1010.5, "attrs": {"val_loss": 2.2}},
    ]
    out = time_to_target(steps, evals, 2.5)
    assert out["reached_target"] is True
    assert out["steps_to_target"] == 8
    assert out["tokens_to_target"] == 8000
    assert out["time_to_target_s"] == pytest.approx(8.5)
    assert time_to_target(steps, evals, 1.0)["reached_target"] is False


def test_scaling_efficiency_against_one_rank():
    # 1 rank: 100 tok/s; 2 ranks: 180 (90%); 4 ranks: 300 (75%)
    assert scaling_efficiency([(1, 100.0), (2, 180.0), (4, 300.0)]) == pytest.approx(
        {1: 1.0, 2: 0.9, 4: 0.75}
    )


def test_each_part_of_the_split_is_the_median_over_steps_of_the_slowest_rank():
    ranks = [
        [record(s, 1.0, compute_s=c) for s, c in ((1, 9.0), (2, 0.2), (3, 0.4), (4, 0.3))],
        [record(s, 1.0, rank=1, compute_s=c) for s, c in ((1, 0.1), (2, 0.5), (3, 0.1), (4, 0.1))],
    ]
    split = measured_split(ranks, 1, {"compute": "compute_s", "stall": "checkpoint_stall_s"})
    # steps 2-4 (step 1 is warm-up): max over ranks 0.5, 0.4, 0.3 -> median 0.4
    assert split["compute"] == pytest.approx(0.4)
    assert split["stall"] is None  # records without the field: not measured, not zero
