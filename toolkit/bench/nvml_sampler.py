"""NVML telemetry sampled by a background thread into memory, then written to HDF5.

Used by the GPU validation script until toolkit.telemetry provides a sampler on main. The
thread never raises into its owner: a failed sample is counted and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

log = logging.getLogger(__name__)

FIELDS = (
    "time",
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
)


class NvmlSampler:
    """Samples device `index` every `interval_s` seconds between start() and stop().

    `nvml` is the pynvml module (nvidia-ml-py); tests pass a fake."""

    def __init__(self, index: int = 0, interval_s: float = 0.2, nvml: Any = None):
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self.index = index
        self.interval_s = interval_s
        self.samples: dict[str, list[float]] = {f: [] for f in FIELDS}
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None

    def start(self) -> None:
        self.nvml.nvmlInit()
        self._handle = self.nvml.nvmlDeviceGetHandleByIndex(self.index)
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        n, h = self.nvml, self._handle
        util = n.nvmlDeviceGetUtilizationRates(h)
        row = {
            "time": time.time(),
            "gpu_util_pct": float(util.gpu),
            "mem_util_pct": float(util.memory),
            "mem_used_bytes": float(n.nvmlDeviceGetMemoryInfo(h).used),
            "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML reports milliwatts
            "temp_c": float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "sm_clock_mhz": float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
        }
        for key, value in row.items():
            self.samples[key].append(value)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - telemetry must never stop the measurement
                self.errors += 1
                if self.errors == 1:
                    log.exception("NVML sample failed (further failures counted silently)")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            log.warning("nvmlShutdown failed", exc_info=True)

    def __len__(self) -> int:
        return len(self.samples["time"])

    def write_h5(self, path: Path) -> int:
        """Write /nvml/<field> datasets; returns the number of samples written."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with h5py.File(path, "w") as f:
            g = f.create_group("nvml")
            g.attrs["device_index"] = self.index
            g.attrs["interval_s"] = self.interval_s
            g.attrs["errors"] = self.errors
            for key, values in self.samples.items():
                g.create_dataset(key, data=np.asarray(values, dtype=np.float64))
        return len(self)


def count_samples(path: Path) -> int:
    """Samples in a telemetry file written by write_h5 (0 if absent or empty)."""
    if not path.exists():
        return 0
    with h5py.File(path, "r") as f:
        return int(f["nvml/time"].shape[0]) if "nvml/time" in f else 0
