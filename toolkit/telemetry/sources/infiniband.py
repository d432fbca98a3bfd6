"""InfiniBand / RoCE port counters from sysfs (<root>/<device>/ports/<port>/counters/).

port_xmit_data and port_rcv_data count 4-byte words (octets / 4); the file stores bytes.
port_xmit_wait counts ticks in which a port had data to send but no credits: congestion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.telemetry.schema import TIME, Column, TableSpec
from toolkit.telemetry.sources import Rate

WORD_BYTES = 4
# sysfs counter -> (column, multiplier)
COUNTERS = {
    "port_xmit_data": ("xmit_bytes", WORD_BYTES),
    "port_rcv_data": ("rcv_bytes", WORD_BYTES),
    "port_xmit_packets": ("xmit_packets", 1),
    "port_rcv_packets": ("rcv_packets", 1),
    "port_xmit_wait": ("xmit_wait", 1),
    "port_xmit_discards": ("xmit_discards", 1),
    "port_rcv_errors": ("rcv_errors", 1),
    "symbol_error": ("symbol_error", 1),
    "link_downed": ("link_downed", 1),
}
RATES = {"xmit_bytes": "bytes/s", "rcv_bytes": "bytes/s", "xmit_wait": "ticks/s"}
UNITS = {"xmit_bytes": "bytes", "rcv_bytes": "bytes", "xmit_wait": "ticks"}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class InfinibandSource:
    name = "ib"

    def __init__(self, root: str | Path = "/sys/class/infiniband"):
        self.root = Path(root)
        self.absent_reason: str | None = None
        self.rate = Rate()
        self.ports: list[tuple[str, Path]] = []  # (table key "<dev>_<port>", port dir)
        if not self.root.is_dir():
            self.absent_reason = f"no InfiniBand/RoCE devices: {self.root} does not exist"
            return
        for dev in sorted(p for p in self.root.iterdir() if (p / "ports").is_dir()):
            for port in sorted((dev / "ports").iterdir(), key=lambda p: p.name):
                if (port / "counters").is_dir():
                    self.ports.append((f"{dev.name}_{port.name}", port))
        if not self.ports:
            self.absent_reason = f"no InfiniBand/RoCE port counters under {self.root}"
        self.counters = {
            key: [c for c in COUNTERS if (port / "counters" / c).is_file()]
            for key, port in self.ports
        }

    def specs(self) -> list[TableSpec]:
        specs = []
        for key, port in self.ports:
            columns = [TIME]
            for counter in self.counters[key]:
                column = COUNTERS[counter][0]
                columns.append(Column(column, "i8", UNITS.get(column, "count")))
                if column in RATES:
                    columns.append(Column(f"{column}_per_s", "f4", RATES[column]))
            attrs = {
                "device": port.parent.parent.name,
                "port": int(port.name) if port.name.isdigit() else port.name,
                "link_layer": _read(port / "link_layer") or "",
                "rate": _read(port / "rate") or "",
                "state": _read(port / "state") or "",
                "sysfs": str(port),
            }
            specs.append(TableSpec(f"ib/{key}", columns, attrs))
        return specs

    def sample(self, now: float) -> dict[str, dict[str, Any]]:
        out = {}
        for key, port in self.ports:
            row: dict[str, Any] = {}
            for counter in self.counters[key]:
                text = _read(port / "counters" / counter)
                if text is None or not text.isdigit():
                    continue
                column, scale = COUNTERS[counter]
                value = int(text) * scale
                row[column] = value
                if column in RATES:
                    row[f"{column}_per_s"] = self.rate(f"{key}/{column}", now, value)
            out[f"ib/{key}"] = row
        return out

    def events(self, now: float) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass
