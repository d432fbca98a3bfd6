"""Per-GPU statistics of a node file: mean utilisation and power, time throttled, peak
temperature, energy."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from toolkit.telemetry.read import NodeData
from toolkit.telemetry.sources.nvml import THROTTLE_MASK


@dataclass
class GpuStats:
    node: str
    index: int
    mean_util_pct: float
    mean_power_w: float
    throttle_s: float
    max_temp_c: float
    energy_j: float


def _sample_dt(times: np.ndarray) -> np.ndarray:
    if len(times) < 2:
        return np.zeros(len(times))
    dt = np.diff(times, append=times[-1])
    typical = float(np.median(dt[:-1]))
    return np.clip(dt, 0, 2 * typical)


def gpu_stats(node: NodeData) -> list[GpuStats]:
    out = []
    for index, t in sorted(node.gpus.items()):
        if len(t) == 0:
            continue
        dt = _sample_dt(t["time"])
        reasons = t.get("clock_event_reasons")
        throttle = float(dt[(reasons & THROTTLE_MASK) != 0].sum()) if reasons is not None else 0.0
        energy = t.get("energy_j")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out.append(
                GpuStats(
                    node=node.node,
                    index=index,
                    mean_util_pct=_nanmean(t.get("utilization_gpu_pct")),
                    mean_power_w=_nanmean(t.get("power_w")),
                    throttle_s=throttle,
                    max_temp_c=_nanmax(t.get("temperature_gpu_c")),
                    energy_j=float(energy[-1] - energy[0]) if energy is not None else float("nan"),
                )
            )
    return out


def _nanmean(a: np.ndarray | None) -> float:
    return float(np.nanmean(a)) if a is not None and len(a) else float("nan")


def _nanmax(a: np.ndarray | None) -> float:
    return float(np.nanmax(a)) if a is not None and len(a) else float("nan")
