"""The NVML readings beyond the basic per-GPU queries of `toolkit.telemetry.sources.nvml`:
field-value counters (memory temperature, PCIe and NVLink bytes), Hopper GPM metrics, and
XID error events.

Each reader is probed once per GPU: what the GPU or driver does not offer is listed in the
reader's `unsupported` and left out of its columns. A failed reading later leaves a gap
(logged at debug level), never an exception.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from toolkit.telemetry.schema import XID
from toolkit.telemetry.sources import Rate

log = logging.getLogger(__name__)

ALL_LINKS = 0xFFFFFFFF  # NVML field scope: aggregate over NVLink links

# Field ids (nvml.h) read with one nvmlDeviceGetFieldValues call per GPU.
FI_MEMORY_TEMP = 82
FI_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB, cumulative
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_PCIE_COUNT_TX_BYTES = 197  # bytes, cumulative
FI_PCIE_COUNT_RX_BYTES = 198

FIELDS = {
    "temperature_memory_c": (FI_MEMORY_TEMP, 0),
    "nvlink_tx_bytes": (FI_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
    "nvlink_rx_bytes": (FI_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
    "pcie_tx_bytes": (FI_PCIE_COUNT_TX_BYTES, 0),
    "pcie_rx_bytes": (FI_PCIE_COUNT_RX_BYTES, 0),
}
FIELD_SCALE = {"nvlink_tx_bytes": 1024.0, "nvlink_rx_bytes": 1024.0}

# GPM metric ids (Hopper+).
GPM_METRICS = {
    "gpm_sm_activity_pct": 2,  # NVML_GPM_METRIC_SM_UTIL
    "gpm_sm_occupancy_pct": 3,  # NVML_GPM_METRIC_SM_OCCUPANCY
    "gpm_tensor_activity_pct": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "gpm_dram_bw_util_pct": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
}

XID_DRAIN_MAX = 64  # events taken per call, so that a flood cannot hold up the sampler


def _field_value(fv: Any) -> float:
    """The number in an nvmlFieldValue_t, by its valueType."""
    kind = int(fv.valueType)
    v = fv.value
    return float(
        {0: v.dVal, 1: v.uiVal, 2: v.ulVal, 3: v.ullVal, 4: v.sllVal, 5: v.siVal}.get(
            kind, v.ullVal
        )
    )


class FieldCounters:
    """One GPU's field values; cumulative byte counters become `<name>_per_s` rates. Drivers
    without the PCIe byte fields fall back to nvmlDeviceGetPcieThroughput (KB/s over a 20 ms
    window, slow: only at intervals of a second or more)."""

    def __init__(self, nvml: Any, handle: Any, index: int, interval_s: float):
        self.nvml = nvml
        self.handle = handle
        self.index = index
        self.rate = Rate()
        self.fields: dict[str, tuple[int, int]] = {}
        self.use_pcie_throughput = False
        self.unsupported: list[str] = []
        for name, fid in FIELDS.items():
            try:
                (fv,) = nvml.nvmlDeviceGetFieldValues(handle, [fid])
                if int(fv.nvmlReturn) == 0:
                    self.fields[name] = fid
                    continue
                self.unsupported.append(f"{name} (field {fid[0]}: return {int(fv.nvmlReturn)})")
            except Exception as exc:  # noqa: BLE001
                self.unsupported.append(f"{name} ({type(exc).__name__})")
        if "pcie_tx_bytes" not in self.fields and interval_s >= 1.0:
            with contextlib.suppress(Exception):  # best effort
                nvml.nvmlDeviceGetPcieThroughput(handle, 0)
                self.use_pcie_throughput = True

    def columns(self) -> set[str]:
        names = {n + "_per_s" if n.endswith("_bytes") else n for n in self.fields}
        if self.use_pcie_throughput:
            names |= {"pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"}
        return names

    def sample(self, now: float) -> dict[str, float]:
        row: dict[str, float] = {}
        if self.fields:
            ids = list(self.fields.values())
            try:
                values = self.nvml.nvmlDeviceGetFieldValues(self.handle, ids)
                for (name, _fid), fv in zip(self.fields.items(), values, strict=True):
                    if int(fv.nvmlReturn) != 0:
                        continue
                    value = _field_value(fv) * FIELD_SCALE.get(name, 1.0)
                    if name.endswith("_bytes"):
                        row[name + "_per_s"] = self.rate(name, now, value)
                    else:
                        row[name] = value
            except Exception as exc:  # noqa: BLE001
                log.debug("nvml field values on gpu %d: %s", self.index, exc)
        if self.use_pcie_throughput:
            with contextlib.suppress(Exception):  # best effort
                row["pcie_tx_bytes_per_s"] = 1024.0 * self.nvml.nvmlDeviceGetPcieThroughput(
                    self.handle, 0
                )
                row["pcie_rx_bytes_per_s"] = 1024.0 * self.nvml.nvmlDeviceGetPcieThroughput(
                    self.handle, 1
                )
        return row


class GpmMetrics:
    """One GPU's GPM metrics (Hopper+), each over the interval since the previous sample."""

    def __init__(self, nvml: Any, handle: Any, index: int, enabled: bool):
        self.nvml = nvml
        self.handle = handle
        self.index = index
        self.previous: Any = None  # the GPM sample the next interval starts from
        self.unsupported: list[str] = []
        if not enabled:
            self.unsupported.append("gpm (telemetry.gpm=false)")
            return
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
            if support.isSupportedDevice:
                self.previous = nvml.nvmlGpmSampleAlloc()
                nvml.nvmlGpmSampleGet(handle, self.previous)
            else:
                self.unsupported.append("gpm (device not supported)")
        except Exception as exc:  # noqa: BLE001
            self.unsupported.append(f"gpm ({type(exc).__name__})")

    def columns(self) -> set[str]:
        return set(GPM_METRICS) if self.previous is not None else set()

    def sample(self) -> dict[str, float]:
        if self.previous is None:
            return {}
        n = self.nvml
        try:
            current = n.nvmlGpmSampleAlloc()
            n.nvmlGpmSampleGet(self.handle, current)
            request = n.c_nvmlGpmMetricsGet_t()
            request.version = n.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = self.previous
            request.sample2 = current
            for i, metric_id in enumerate(GPM_METRICS.values()):
                request.metrics[i].metricId = metric_id
            n.nvmlGpmMetricsGet(request)
        except Exception as exc:  # noqa: BLE001
            log.debug("nvml gpm on gpu %d: %s", self.index, exc)
            return {}
        with contextlib.suppress(Exception):  # best effort
            n.nvmlGpmSampleFree(self.previous)
        self.previous = current
        out = {}
        for i, name in enumerate(GPM_METRICS):
            metric = request.metrics[i]
            if int(metric.nvmlReturn) == 0:
                out[name] = float(metric.value)
        return out


def register_xid(nvml: Any, handles: list[Any]) -> Any:
    """An NVML event set that collects the XID errors of these GPUs (raises where NVML
    does not offer events, e.g. in some containers)."""
    event_set = nvml.nvmlEventSetCreate()
    for handle in handles:
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
    return event_set


def drain_xid(nvml: Any, event_set: Any, now: float) -> list[dict[str, Any]]:
    """The XID errors pending on the event set, as node events (a non-blocking wait)."""
    out = []
    for _ in range(XID_DRAIN_MAX):
        try:
            data = nvml.nvmlEventSetWait(event_set, 0)
        except Exception:  # noqa: BLE001 - NVMLError_Timeout: nothing pending
            break
        try:
            gpu = int(nvml.nvmlDeviceGetIndex(data.device))
        except Exception:  # noqa: BLE001
            gpu = -1
        out.append(
            {
                "name": XID,
                "start": now,
                "end": now,
                "attrs": {"gpu": gpu, "xid": int(data.eventData)},
            }
        )
    return out
