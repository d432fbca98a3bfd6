"""GPU metrics through NVML (`import pynvml`, package nvidia-ml-py).

The source takes the NVML module as an argument so that tests can hand it an object that
answers the same calls with recorded values. Each metric is probed once at start: one that
the GPU or driver does not offer (NVMLError) is left out of that GPU's table and listed in
the group's `unsupported` attribute. Slow-changing counters (ECC, retired pages, remapped
rows) are read at most every SLOW_EVERY_S and repeated in between. Field-value counters,
GPM metrics and XID events are read by `toolkit.telemetry.sources.nvml_extras`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from toolkit.telemetry.schema import TIME, Column, TableSpec
from toolkit.telemetry.sources.nvml_extras import (
    GPM_METRICS,
    FieldCounters,
    GpmMetrics,
    drain_xid,
    register_xid,
)

log = logging.getLogger(__name__)

SLOW_EVERY_S = 10.0

# nvmlClocksEventReasons bits (named as in nvml.h).
CLOCK_EVENT_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # reasons that cost speed under load

# column -> units, dtype; the order is the order in the file.
COLUMNS: list[Column] = [
    Column("utilization_gpu_pct", "f4", "%"),
    Column("utilization_memory_pct", "f4", "%"),
    Column("memory_used_bytes", "i8", "bytes"),
    Column("memory_total_bytes", "i8", "bytes"),
    Column("power_w", "f4", "W"),
    Column("energy_j", "f8", "J since driver load"),
    Column("temperature_gpu_c", "f4", "degC"),
    Column("temperature_memory_c", "f4", "degC"),
    Column("clock_sm_mhz", "f4", "MHz"),
    Column("clock_mem_mhz", "f4", "MHz"),
    Column("clock_event_reasons", "u8", "bitmask (attribute clock_event_bits)"),
    Column("pcie_tx_bytes_per_s", "f4", "bytes/s"),
    Column("pcie_rx_bytes_per_s", "f4", "bytes/s"),
    Column("nvlink_tx_bytes_per_s", "f4", "bytes/s"),
    Column("nvlink_rx_bytes_per_s", "f4", "bytes/s"),
    Column("ecc_corrected_volatile", "i8", "count"),
    Column("ecc_uncorrected_volatile", "i8", "count"),
    Column("retired_pages_sbe", "i8", "count"),
    Column("retired_pages_dbe", "i8", "count"),
    Column("remapped_rows_correctable", "i8", "count"),
    Column("remapped_rows_uncorrectable", "i8", "count"),
    Column("remapped_rows_pending", "i8", "0/1"),
    *(Column(name, "f4", "%") for name in GPM_METRICS),
]
SLOW = {
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Gpu:
    """One device: which metrics it offers, and how to read them."""

    def __init__(self, nvml: Any, index: int, use_gpm: bool, interval_s: float):
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.slow_values: dict[str, Any] = {}
        self.slow_at = 0.0
        self.readers = self._readers()
        self.unsupported: list[str] = []
        self._probe()
        self.counters = FieldCounters(nvml, self.handle, index, interval_s)
        self.gpm = GpmMetrics(nvml, self.handle, index, use_gpm)

    def _readers(self) -> dict[str, Callable[[], dict[str, Any]]]:
        n, h = self.nvml, self.handle

        def util() -> dict[str, Any]:
            u = n.nvmlDeviceGetUtilizationRates(h)
            return {"utilization_gpu_pct": u.gpu, "utilization_memory_pct": u.memory}

        def memory() -> dict[str, Any]:
            m = n.nvmlDeviceGetMemoryInfo(h)
            return {"memory_used_bytes": int(m.used), "memory_total_bytes": int(m.total)}

        def clocks_reasons() -> dict[str, Any]:
            get = (
                getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or n.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            return {"clock_event_reasons": int(get(h))}

        def ecc() -> dict[str, Any]:
            return {
                "ecc_corrected_volatile": int(n.nvmlDeviceGetTotalEccErrors(h, 0, 0)),
                "ecc_uncorrected_volatile": int(n.nvmlDeviceGetTotalEccErrors(h, 1, 0)),
            }

        def retired() -> dict[str, Any]:
            return {
                "retired_pages_sbe": len(n.nvmlDeviceGetRetiredPages(h, 0)),
                "retired_pages_dbe": len(n.nvmlDeviceGetRetiredPages(h, 1)),
            }

        def remapped() -> dict[str, Any]:
            corr, unc, pending, _failed = n.nvmlDeviceGetRemappedRows(h)
            return {
                "remapped_rows_correctable": int(corr),
                "remapped_rows_uncorrectable": int(unc),
                "remapped_rows_pending": int(pending),
            }

        return {
            "utilization": util,
            "memory": memory,
            "power": lambda: {"power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0},
            "energy": lambda: {"energy_j": n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0},
            "temperature": lambda: {"temperature_gpu_c": n.nvmlDeviceGetTemperature(h, 0)},
            "clocks": lambda: {
                "clock_sm_mhz": n.nvmlDeviceGetClockInfo(h, 1),
                "clock_mem_mhz": n.nvmlDeviceGetClockInfo(h, 2),
            },
            "clock_event_reasons": clocks_reasons,
            "ecc": ecc,
            "retired_pages": retired,
            "remapped_rows": remapped,
        }

    def _probe(self) -> None:
        for name, read in list(self.readers.items()):
            try:
                read()
            except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported and friends
                self.unsupported.append(f"{name} ({type(exc).__name__})")
                del self.readers[name]

    def columns(self) -> list[Column]:
        offered = set()
        for read in self.readers.values():
            with contextlib.suppress(Exception):  # best effort
                offered |= set(read())
        offered |= self.counters.columns() | self.gpm.columns()
        return [TIME] + [c for c in COLUMNS if c.name in offered]

    def static_attrs(self) -> dict[str, Any]:
        n, h = self.nvml, self.handle
        attrs: dict[str, Any] = {"index": self.index, "clock_event_bits": _bits_doc()}
        for key, call in (
            ("name", lambda: _text(n.nvmlDeviceGetName(h))),
            ("uuid", lambda: _text(n.nvmlDeviceGetUUID(h))),
            ("pci_bus_id", lambda: _text(n.nvmlDeviceGetPciInfo(h).busId)),
            ("power_limit_w", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
        ):
            with contextlib.suppress(Exception):  # best effort
                attrs[key] = call()
        attrs["unsupported"] = self.unsupported + self.counters.unsupported + self.gpm.unsupported
        return attrs

    def sample(self, now: float) -> dict[str, Any]:
        row: dict[str, Any] = {}
        slow_due = now - self.slow_at >= SLOW_EVERY_S
        for name, read in self.readers.items():
            if name in ("ecc", "retired_pages", "remapped_rows") and not slow_due:
                row.update({k: v for k, v in self.slow_values.items() if k in SLOW})
                continue
            try:
                values = read()
            except Exception as exc:  # noqa: BLE001 - one failed reading leaves a gap
                log.debug("nvml %s on gpu %d: %s", name, self.index, exc)
                continue
            row.update(values)
            if SLOW & set(values):
                self.slow_values.update(values)
        if slow_due:
            self.slow_at = now
        row.update(self.counters.sample(now))
        row.update(self.gpm.sample())
        return row


def _bits_doc() -> str:
    return ", ".join(f"0x{bit:x}={name}" for bit, name in CLOCK_EVENT_BITS.items())


class NvmlSource:
    name = "gpu"

    def __init__(self, nvml: Any | None = None, *, gpm: bool = True, interval_s: float = 1.0):
        self.absent_reason: str | None = None
        self.gpus: list[_Gpu] = []
        self.attrs: dict[str, Any] = {}
        self._events: Any = None
        self.nvml = nvml
        try:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            self.nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no driver, no library: CI, laptops
            self.absent_reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return
        try:
            count = self.nvml.nvmlDeviceGetCount()
            if count == 0:
                self.absent_reason = "NVML found no GPU"
                return
            self.gpus = [_Gpu(self.nvml, i, gpm, interval_s) for i in range(count)]
            self.attrs = self._system_attrs()
            self._events = self._register_xid()
        except Exception as exc:  # noqa: BLE001
            self.absent_reason = f"NVML failed: {type(exc).__name__}: {exc}"
            self.gpus = []

    def _system_attrs(self) -> dict[str, Any]:
        n = self.nvml
        attrs: dict[str, Any] = {}
        for key, call in (
            ("driver_version", lambda: _text(n.nvmlSystemGetDriverVersion())),
            ("nvml_version", lambda: _text(n.nvmlSystemGetNVMLVersion())),
            ("cuda_driver_version", lambda: n.nvmlSystemGetCudaDriverVersion()),
        ):
            with contextlib.suppress(Exception):  # best effort
                attrs[key] = call()
        statics = [g.static_attrs() for g in self.gpus]
        attrs["gpu_models"] = [str(s.get("name", "?")) for s in statics]
        attrs["gpu_uuids"] = [str(s.get("uuid", "?")) for s in statics]
        return attrs

    def _register_xid(self) -> Any:
        try:
            return register_xid(self.nvml, [gpu.handle for gpu in self.gpus])
        except Exception as exc:  # noqa: BLE001 - not offered (e.g. some containers)
            self.attrs["xid_events"] = f"not recorded: {type(exc).__name__}"
            return None

    def specs(self) -> list[TableSpec]:
        return [TableSpec(f"gpu/{g.index}", g.columns(), g.static_attrs()) for g in self.gpus]

    def sample(self, now: float) -> dict[str, dict[str, Any]]:
        return {f"gpu/{g.index}": g.sample(now) for g in self.gpus}

    def events(self, now: float) -> list[dict[str, Any]]:
        """XID errors since the last call (non-blocking wait on the NVML event set)."""
        if self._events is None:
            return []
        return drain_xid(self.nvml, self._events, now)

    def close(self) -> None:
        if self.absent_reason is not None:
            return
        with contextlib.suppress(Exception):  # best effort
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()
