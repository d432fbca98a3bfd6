"""From raw measurements to a hardware profile (pure arithmetic; toolkit.measure.hardware
measures). Rates become fractions of the best rate measured, collective timings become a
latency and a bandwidth, and the profile is written as YAML that `hardware=` loads."""

from __future__ import annotations

import dataclasses
from typing import Any

from toolkit.config.hardware import AttentionPoint, GemmPoint, HardwareConfig


def gemm_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def causal_sdpa_flops(batch_heads: int, seq_len: int, head_dim: int) -> float:
    """Executed FLOPs of causal SDPA forward + backward: QK^T and AV are 2*S*S*h each
    forward, backward twice the forward; causal executes half."""
    return 0.5 * 3 * 2 * (2.0 * seq_len * seq_len * head_dim) * batch_heads


def latency_bandwidth(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(bytes received per rank, seconds per call) points -> (latency s, bandwidth B/s):
    latency is the smallest message's time, bandwidth the slope between the smallest and the
    largest message (the alpha-beta model of one call: latency + bytes / bandwidth)."""
    ordered = sorted(points)
    (b0, t0), (b1, t1) = ordered[0], ordered[-1]
    slope = (t1 - t0) / (b1 - b0) if b1 > b0 else 0.0
    bandwidth = 1.0 / slope if slope > 0 else b1 / t1
    return t0, bandwidth


def fsdp_bandwidth(bytes_received: float, extra_s: float, fixed_s: float, raw: float) -> float:
    """Bandwidth of the collectives as FSDP2 runs them: bytes over the extra time FSDP2 adds
    to a step, less the per-call latency and overhead (`fixed_s`); never above the raw
    collective's bandwidth, and the raw one when the difference is lost in noise."""
    moving_s = extra_s - fixed_s
    if moving_s <= 0 or bytes_received <= 0:
        return raw
    return min(raw, bytes_received / moving_s)


def gemm_table(
    rates: list[tuple[int, int, int, str, float]], peaks: dict[str, float]
) -> list[GemmPoint]:
    """(m, n, k, dtype, FLOP/s) -> points with the fraction of that dtype's peak."""
    return [
        GemmPoint(m=m, n=n, k=k, dtype=dtype, fraction=round(min(1.0, rate / peaks[dtype]), 4))
        for m, n, k, dtype, rate in rates
    ]


def attention_table(
    rates: list[tuple[int, int, str, float]], peaks: dict[str, float]
) -> list[AttentionPoint]:
    """(seq_len, head_dim, dtype, FLOP/s) of causal SDPA (what kernel_rates measures) ->
    causal points with the fraction of that dtype's peak."""
    return [
        AttentionPoint(
            seq_len=s,
            head_dim=h,
            dtype=dtype,
            fraction=round(min(1.0, r / peaks[dtype]), 4),
            causal=True,
        )
        for s, h, dtype, r in rates
    ]


def profile_yaml(hw: HardwareConfig, comments: list[str]) -> str:
    """The profile as a conf/hardware YAML (extends the schema), with comments first."""
    from omegaconf import OmegaConf

    data: dict[str, Any] = {"defaults": ["hardware_schema"], **dataclasses.asdict(hw)}
    header = "".join(f"# {line}\n" for line in comments)
    return header + OmegaConf.to_yaml(OmegaConf.create(data))
