"""What the node file holds: table specs (a table is an HDF5 group of equal-length 1-D
datasets, one per column, each with a `units` attribute) and the names shared by writer,
reader, docs and tests."""

from __future__ import annotations

import dataclasses
import os
import socket
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.events import StepRecord

FORMAT = "toolkit-telemetry"
FORMAT_VERSION = 1
TELEMETRY_DIR = "telemetry"

# Event names with a meaning for the report. Checkpoint events may carry attrs["phase"]:
# "staging" and "stall" block training; "write" (background) does not (see
# toolkit.telemetry.report.analysis.is_blocking_checkpoint).
CHECKPOINT = "checkpoint"
PREEMPTION = "preemption"
RESTART = "restart"
EVAL = "eval"
XID = "xid"
EVENT_NAME_BYTES = 64
EVENT_ATTRS_BYTES = 1024


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # numpy dtype string: f8, f4, i8, i4, u8, S64 ...
    units: str


@dataclass
class TableSpec:
    path: str  # HDF5 group path, e.g. "gpu/0"
    columns: list[Column]
    attrs: dict[str, Any] = field(default_factory=dict)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


TIME = Column("time", "f8", "s since epoch")


def units_for(name: str) -> str:
    """Units of a StepRecord field, from its name (the naming rule of STYLE.md)."""
    if name == "wall_time":
        return "s since epoch"
    if name.endswith("_per_s"):  # a rate: tokens_per_s -> tokens/s, samples_per_s -> samples/s
        return name.removesuffix("_per_s") + "/s"
    if name.endswith("_s"):
        return "s"
    if name.endswith("_bytes"):
        return "bytes"
    if name == "mfu":
        return "fraction"
    if name == "lr":
        return "1"
    if name in ("step", "tokens"):
        return "count"
    return "1"


def step_columns() -> list[Column]:
    """One column per numeric StepRecord field (a field added there appears here)."""
    hints = typing.get_type_hints(StepRecord)
    columns = []
    for f in dataclasses.fields(StepRecord):
        if f.name == "rank":
            continue  # the group name says it
        kind = hints[f.name]
        if kind is int:
            columns.append(Column(f.name, "i8", units_for(f.name)))
        elif kind is float:
            columns.append(Column(f.name, "f8", units_for(f.name)))
    return columns


def steps_spec(rank: int) -> TableSpec:
    return TableSpec(f"steps/rank{rank}", step_columns(), {"rank": rank})


EVENT_COLUMNS = [
    Column("start", "f8", "s since epoch"),
    Column("end", "f8", "s since epoch"),
    Column("step", "i8", "count"),
    Column("rank", "i4", "rank (-1: node agent)"),
    Column("name", f"S{EVENT_NAME_BYTES}", "ascii"),
    Column("attrs", f"S{EVENT_ATTRS_BYTES}", "json"),
]


def events_spec() -> TableSpec:
    return TableSpec("events", EVENT_COLUMNS)


def node_name() -> str:
    """Slurm's name for this node when in a job (SLURMD_NODENAME), else the short hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def node_file_name(node: str, attempt: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in node)
    return f"node-{safe}-attempt{attempt}.h5"


def telemetry_dir(run_dir: Path) -> Path:
    return run_dir / TELEMETRY_DIR


def empty_value(dtype: str) -> Any:
    """The fill value of a missing reading: NaN for floats, -1 for integers."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        return np.nan
    if kind in "iu":
        return -1 if kind == "i" else 0
    return b""
