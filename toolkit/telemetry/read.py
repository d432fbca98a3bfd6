"""Reading node files, while they are written (SWMR) or after, into plain numpy columns.

Columns are read lazily (a report touches a few of the ~30 GPU columns), and a table's
length is the shortest of its columns: a reader may look between two column appends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from toolkit.telemetry.h5store import open_read
from toolkit.telemetry.schema import FORMAT, telemetry_dir


class Table:
    """A group of equal-length columns. In a file still being written (SWMR) every column
    is refreshed and the length is the shortest; in a finished file columns are opened only
    when read (a report touches a few of ~30 GPU columns)."""

    def __init__(self, group: h5py.Group):
        self.group = group
        self.attrs = {k: _attr(v) for k, v in group.attrs.items()}
        self.names = list(group.keys())
        self.datasets: dict[str, h5py.Dataset] = {}
        if group.file.swmr_mode:
            self.names = [n for n in self.names if isinstance(group[n], h5py.Dataset)]
            for name in self.names:
                ds = self.datasets[name] = group[name]
                ds.refresh()  # see the writer's latest flush
            self.length = min((d.shape[0] for d in self.datasets.values()), default=0)
        else:
            self.names = [n for n in self.names if group.get(n, getclass=True) is h5py.Dataset]
            first = "time" if "time" in self.names else (self.names[0] if self.names else None)
            self.length = self._dataset(first).shape[0] if first else 0
        self._cache: dict[str, np.ndarray] = {}

    def refresh(self) -> None:
        """See the writer's latest flush (a file still written, SWMR); else nothing changes."""
        if not self.group.file.swmr_mode:
            return
        for ds in self.datasets.values():
            ds.refresh()
        self.length = min((d.shape[0] for d in self.datasets.values()), default=0)
        self._cache.clear()

    def _dataset(self, name: str) -> h5py.Dataset:
        if name not in self.datasets:
            self.datasets[name] = self.group[name]
        return self.datasets[name]

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = self._dataset(name)[: self.length]
        return self._cache[name]

    def get(self, name: str) -> np.ndarray | None:
        return self[name] if name in self.names else None

    def tail(self, name: str, rows: int) -> np.ndarray:
        start = max(0, self.length - rows)
        return self._dataset(name)[start : self.length]

    def units(self, name: str) -> str:
        return _attr(self._dataset(name).attrs.get("units", ""))


def _attr(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray) and value.dtype.kind in "OS":
        return [v.decode() if isinstance(v, bytes) else str(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass
class NodeData:
    path: Path
    file: h5py.File
    attrs: dict[str, Any]
    gpus: dict[int, Table] = field(default_factory=dict)
    host: Table | None = None
    net: dict[str, Table] = field(default_factory=dict)
    ib: dict[str, Table] = field(default_factory=dict)
    steps: dict[int, Table] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def node(self) -> str:
        return str(self.attrs.get("node", self.path.stem))

    @property
    def attempt(self) -> int:
        return int(self.attrs.get("attempt", 0))

    @property
    def job_id(self) -> str:
        return str(self.attrs.get("job_id", ""))

    @property
    def ranks(self) -> list[int]:
        return [int(r) for r in np.atleast_1d(self.attrs.get("ranks", []))]

    def absent(self) -> dict[str, str]:
        return {
            k.removesuffix("_absent_reason"): str(v)
            for k, v in self.attrs.items()
            if k.endswith("_absent_reason")
        }

    def refresh(self) -> None:
        for table in [*self.gpus.values(), self.host, *self.net.values(), *self.ib.values()]:
            if table is not None:
                table.refresh()
        for table in self.steps.values():
            table.refresh()

    def close(self) -> None:
        if self.file is not None:  # None: a summary's stand-in (report/scaled.py)
            self.file.close()


def load_node(path: Path, events: bool = True) -> NodeData:
    """Open one node file (raises OSError/KeyError/ValueError when it is not readable);
    events=False leaves the events table unread (a live view does not show them)."""
    f = open_read(path)
    try:
        attrs = {k: _attr(v) for k, v in f.attrs.items()}
        if attrs.get("format") != FORMAT:
            raise ValueError(f"not a telemetry file (format attribute {attrs.get('format')!r})")
        data = NodeData(path=path, file=f, attrs=attrs)
        if "gpu" in f:
            data.gpus = {int(k): Table(g) for k, g in f["gpu"].items()}
        if "host" in f:
            data.host = Table(f["host"])
            if "net" in f["host"]:
                data.net = {k: Table(g) for k, g in f["host/net"].items()}
        if "ib" in f:
            data.ib = {k: Table(g) for k, g in f["ib"].items()}
        if "steps" in f:
            data.steps = {int(k.removeprefix("rank")): Table(g) for k, g in f["steps"].items()}
        if events and "events" in f:
            data.events = read_events(Table(f["events"]), data.node, data.attempt)
        return data
    except BaseException:
        f.close()
        raise


def read_events(table: Table, node: str, attempt: int) -> list[dict[str, Any]]:
    out = []
    if len(table) == 0:
        return out
    for start, end, step, rank, name, attrs in zip(
        table["start"],
        table["end"],
        table["step"],
        table["rank"],
        table["name"],
        table["attrs"],
        strict=True,
    ):
        try:
            parsed = json.loads(attrs.decode() or "{}")
        except ValueError:
            parsed = {"raw": attrs.decode(errors="replace")}
        out.append(
            {
                "name": name.decode(errors="replace"),
                "start": float(start),
                "end": float(end),
                "step": int(step),
                "rank": int(rank),
                "attrs": parsed,
                "node": node,
                "attempt": attempt,
            }
        )
    return out


def node_files(run_dir: Path) -> list[Path]:
    return sorted(telemetry_dir(run_dir).glob("node-*.h5"))


@dataclass
class RunData:
    run_dir: Path
    nodes: list[NodeData]
    skipped: list[tuple[Path, str]]  # unreadable files and why

    def close(self) -> None:
        for n in self.nodes:
            n.close()


class NoTelemetry(Exception):
    """The run dir holds no readable telemetry (message: one line for the user)."""


def load_run(run_dir: Path, events: bool = True) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NoTelemetry(f"{run_dir}: no such run directory")
    files = node_files(run_dir)
    if not files:
        raise NoTelemetry(
            f"{run_dir}: no telemetry (expected {telemetry_dir(run_dir)}/node-*.h5; "
            "was the run started with telemetry.enabled=false?)"
        )
    nodes, skipped = [], []
    for path in files:
        try:
            nodes.append(load_node(path, events))
        except Exception as exc:  # noqa: BLE001 - name it, skip it, report the rest
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            skipped.append((path, f"{type(exc).__name__}: {reason}"))
    if not nodes:
        names = "; ".join(f"{p.name} ({why})" for p, why in skipped)
        raise NoTelemetry(f"{run_dir}: no readable telemetry file: {names}")
    nodes.sort(key=lambda n: (n.attempt, n.node))
    return RunData(run_dir, nodes, skipped)
