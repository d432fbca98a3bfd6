"""Peak numbers of the accelerator, for MFU and the performance model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class HardwareConfig:
    name: str = "cpu"
    peak_flops_fp32: float = 1.0e11  # dense FLOP/s per device
    peak_flops_bf16: float = 1.0e11
    memory_bandwidth: float = 2.0e10  # bytes/s per device
    memory_bytes: float = 1.6e10  # device memory per device
    intra_node_bandwidth: float = 1.0e10  # bytes/s per device (NVLink; shared memory on CPU)
    inter_node_bandwidth: float = 1.25e9  # bytes/s per device (one NIC per GPU)

    def peak_flops(self, dtype: str) -> float:
        return self.peak_flops_bf16 if dtype in ("bfloat16", "float16") else self.peak_flops_fp32


def problems(hw: HardwareConfig) -> list[str]:
    """Every rate and size must be positive (they divide in MFU and the performance model)."""
    numbers = [f.name for f in dataclasses.fields(hw) if f.name != "name"]
    return [
        f"hardware.{name}={getattr(hw, name)}: must be > 0"
        for name in numbers
        if not getattr(hw, name) > 0
    ]
