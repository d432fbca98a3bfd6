"""Benchmark statistics from per-step records (pure: lists of dicts in, numbers out)."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

PHASES = ("forward_backward_s", "optimizer_s", "data_wait_s")


def steps_by_number(records_by_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per step across ranks: a step takes as long as its slowest rank, so times
    are the max over ranks; memory is the max too."""
    merged: dict[int, dict[str, Any]] = {}
    for records in records_by_rank:
        for r in records:
            m = merged.setdefault(r["step"], dict(r))
            for key in ("step_time_s", "mem_peak_bytes", *PHASES):
                m[key] = max(m[key], r[key])
    return [merged[s] for s in sorted(merged)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else 0.0


def step_statistics(
    steps: list[dict[str, Any]],
    warmup: int,
    *,
    world_size: int,
    flops_per_token: float,
    peak_flops: float,
) -> dict[str, Any]:
    """Median/p10/p90 step time, throughput, MFU, peak memory and the phase split of the
    measured steps (those after the first `warmup`)."""
    measured = [s for s in steps if s["step"] > warmup]
    if not measured:
        raise ValueError(
            f"no measured steps: {len(steps)} steps recorded, warm-up excludes the first {warmup}"
        )
    times = [s["step_time_s"] for s in measured]
    median = statistics.median(times)
    tokens_per_step = measured[0]["tokens"]
    tokens_per_s = tokens_per_step / median if median > 0 else 0.0
    phases = {p: statistics.median(s[p] for s in measured) for p in PHASES}
    total_time = sum(times)
    return {
        "warmup_steps": warmup,
        "measured_steps": len(measured),
        "tokens_per_step": tokens_per_step,
        "step_time_s_median": median,
        "step_time_s_p10": percentile(times, 10),
        "step_time_s_p90": percentile(times, 90),
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / world_size,
        "mfu": tokens_per_s * flops_per_token / (peak_flops * world_size) if peak_flops else 0.0,
        "peak_memory_bytes": max(s["mem_peak_bytes"] for s in steps),
        "data_wait_share": sum(s["data_wait_s"] for s in measured) / total_time
        if total_time > 0
        else 0.0,
        **phases,
        "measured_dominant": max(phases, key=lambda p: phases[p]),
        "final_loss": measured[-1]["loss"],
    }


def time_to_target(
    steps: list[dict[str, Any]], evals: list[dict[str, Any]], target: float | None
) -> dict[str, Any]:
    """Wall time and tokens from the start of the first step to the end of the first
    evaluation at or below `target` (evaluation time included, so settings compare fairly).
    None fields when no target was set or it was not reached."""
    out: dict[str, Any] = {
        "target_val_loss": target,
        "reached_target": False,
        "time_to_target_s": None,
        "tokens_to_target": None,
        "steps_to_target": None,
    }
    if target is None or not steps:
        return out
    started = steps[0]["wall_time"] - steps[0]["step_time_s"]
    tokens_per_step = steps[0]["tokens"]
    for e in sorted(evals, key=lambda e: e["step"]):
        if e["attrs"]["val_loss"] <= target:
            out.update(
                reached_target=True,
                time_to_target_s=e["end"] - started,
                tokens_to_target=e["step"] * tokens_per_step,
                steps_to_target=e["step"],
            )
            break
    return out


def scaling_efficiency(points: list[tuple[int, float]]) -> dict[int, float]:
    """{world: throughput(world) / (world/w0 * throughput(w0))} for (world, tokens/s) points
    of otherwise identical runs; w0 is the smallest world size (1 when it was measured, which
    gives the usual tokens/s at N ranks / (N x tokens/s at 1))."""
    if not points:
        return {}
    w0, t0 = min(points)
    return {w: (t / (w / w0 * t0) if t0 > 0 else 0.0) for w, t in points}


def measured_split(
    records_by_rank: list[list[dict[str, Any]]], warmup: int, fields: dict[str, str]
) -> dict[str, float | None]:
    """{part: seconds} for each `fields` part (part -> StepRecord field): per measured step
    the largest rank's value (the step waits for it), then the median over steps; None when
    the records lack the field (a run without the step split)."""
    out: dict[str, float | None] = {}
    for part, name in fields.items():
        per_step: dict[int, float] = {}
        for records in records_by_rank:
            for r in records:
                if r["step"] > warmup and name in r:
                    per_step[r["step"]] = max(per_step.get(r["step"], 0.0), float(r[name]))
        out[part] = statistics.median(per_step.values()) if per_step else None
    return out
