"""Host metrics through psutil: CPU, memory, load, disk and per-interface network bytes."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from toolkit.telemetry.schema import TIME, Column, TableSpec
from toolkit.telemetry.sources import Rate

log = logging.getLogger(__name__)

HOST_COLUMNS = [
    TIME,
    Column("cpu_pct", "f4", "% of all cores"),
    Column("mem_used_bytes", "i8", "bytes"),
    Column("mem_available_bytes", "i8", "bytes"),
    Column("mem_total_bytes", "i8", "bytes"),
    Column("swap_used_bytes", "i8", "bytes"),
    Column("load_1m", "f4", "runnable tasks"),
    Column("load_5m", "f4", "runnable tasks"),
    Column("load_15m", "f4", "runnable tasks"),
    Column("disk_read_bytes", "i8", "bytes since boot"),
    Column("disk_write_bytes", "i8", "bytes since boot"),
    Column("disk_read_bytes_per_s", "f4", "bytes/s"),
    Column("disk_write_bytes_per_s", "f4", "bytes/s"),
]
NET_COLUMNS = [
    TIME,
    Column("rx_bytes", "i8", "bytes since boot"),
    Column("tx_bytes", "i8", "bytes since boot"),
    Column("rx_bytes_per_s", "f4", "bytes/s"),
    Column("tx_bytes_per_s", "f4", "bytes/s"),
]


def _iface_key(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


class HostSource:
    name = "host"

    def __init__(self) -> None:
        self.absent_reason: str | None = None
        self.rate = Rate()
        try:
            import psutil

            self.psutil = psutil
            psutil.cpu_percent(None)  # first call primes the counter
            self.interfaces = sorted(psutil.net_io_counters(pernic=True))
        except Exception as exc:  # noqa: BLE001
            self.absent_reason = f"psutil unavailable: {type(exc).__name__}: {exc}"
            self.interfaces = []

    def specs(self) -> list[TableSpec]:
        if self.absent_reason:
            return []
        attrs = {"cpu_count": os.cpu_count() or 0}
        specs = [TableSpec("host", HOST_COLUMNS, attrs)]
        specs += [
            TableSpec(f"host/net/{_iface_key(i)}", NET_COLUMNS, {"interface": i})
            for i in self.interfaces
        ]
        return specs

    def sample(self, now: float) -> dict[str, dict[str, Any]]:
        ps = self.psutil
        row: dict[str, Any] = {"cpu_pct": ps.cpu_percent(None)}
        try:
            vm = ps.virtual_memory()
            row.update(
                mem_used_bytes=vm.used, mem_available_bytes=vm.available, mem_total_bytes=vm.total
            )
            row["swap_used_bytes"] = ps.swap_memory().used
        except Exception as exc:  # noqa: BLE001
            log.debug("host memory: %s", exc)
        with contextlib.suppress(OSError):
            row["load_1m"], row["load_5m"], row["load_15m"] = os.getloadavg()
        try:
            disk = ps.disk_io_counters()
            if disk is not None:
                row["disk_read_bytes"] = disk.read_bytes
                row["disk_write_bytes"] = disk.write_bytes
                row["disk_read_bytes_per_s"] = self.rate("disk_r", now, disk.read_bytes)
                row["disk_write_bytes_per_s"] = self.rate("disk_w", now, disk.write_bytes)
        except Exception as exc:  # noqa: BLE001 - containers without /proc/diskstats
            log.debug("host disk: %s", exc)
        out = {"host": row}
        try:
            nics = ps.net_io_counters(pernic=True)
        except Exception:  # noqa: BLE001
            nics = {}
        for name in self.interfaces:
            c = nics.get(name)
            if c is None:
                continue
            out[f"host/net/{_iface_key(name)}"] = {
                "rx_bytes": c.bytes_recv,
                "tx_bytes": c.bytes_sent,
                "rx_bytes_per_s": self.rate(f"{name}/rx", now, c.bytes_recv),
                "tx_bytes_per_s": self.rate(f"{name}/tx", now, c.bytes_sent),
            }
        return out

    def events(self, now: float) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass
