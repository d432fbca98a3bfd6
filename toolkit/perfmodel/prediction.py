"""What the performance model predicts for one layout (`Prediction`: FLOPs, memory,
communication, time by term) and the memory a rank may use: the data type below both
predictors (toolkit.perfmodel.model for the built-in transformers, counted_model for any
model by its counted costs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.config.hardware import HardwareConfig


@dataclass(frozen=True)
class Prediction:
    flops: dict[str, float]
    memory: dict[str, Any]
    communication: dict[str, float]
    time: dict[str, float | str]
    tokens_per_step: int
    world_size: int

    @property
    def fits(self) -> bool:
        return bool(self.memory["fits"])

    @property
    def step_s(self) -> float:
        return float(self.time["step_s"])

    @property
    def dominant(self) -> str:
        return str(self.time["dominant"])

    @property
    def tokens_per_s(self) -> float:
        """0 for a layout that does not fit: it has no throughput."""
        return self.tokens_per_step / self.step_s if self.fits and self.step_s > 0 else 0.0

    def step_range_s(self) -> tuple[float, float]:
        """The step time's range under the hardware profile's stated uncertainty."""
        u = float(self.time["uncertainty"])
        return self.step_s / (1 + u), self.step_s * (1 + u)

    def utilisation(self, peak_flops: float) -> dict[str, float]:
        """MFU (model FLOPs) and HFU (executed FLOPs, recompute included) against a peak."""
        if not self.fits or self.step_s <= 0:
            return {"mfu": 0.0, "hfu": 0.0}
        denominator = self.step_s * self.world_size * peak_flops
        return {
            "mfu": self.flops["model_flops_per_step"] / denominator,
            "hfu": self.flops["executed_flops_per_step"] / denominator,
        }

    def does_not_fit(self) -> str:
        """'' when it fits, else one line: the peak, the capacity and the largest term."""
        if self.fits:
            return ""
        m = self.memory
        term = str(m["largest_term"])
        where = f" on pipeline rank {m['stage']}" if len(m["stage_peaks_bytes"]) > 1 else ""
        return (
            f"does not fit: peak {m['peak_bytes'] / 2**30:,.2f} GiB{where} > "
            f"{m['capacity_bytes'] / 2**30:,.2f} GiB per device; largest term "
            f"{term.removesuffix('_bytes')} {m[term] / 2**30:,.2f} GiB"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "flops": self.flops,
            "memory": self.memory,
            "communication": self.communication,
            "time": self.time,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_s,
            "world_size": self.world_size,
            "fits": self.fits,
        }


def device_capacity(hw: HardwareConfig, ranks_per_node: int) -> float:
    """Memory one rank may use: the device's, or on CPU the node's RAM shared by its ranks."""
    return hw.memory_bytes / ranks_per_node if hw.cores_per_node > 0 else hw.memory_bytes
