"""The node file on disk: one writer (the node agent), any number of SWMR readers.

All groups and datasets are created up front, then the file switches to SWMR mode
(HDF5 forbids creating objects afterwards); rows are buffered in memory and appended at
each `flush()`, after which readers in other processes see them, and a SIGKILLed writer
leaves a file readable up to that flush. Readers must open with `swmr=True` (`open_read`).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from toolkit.telemetry.schema import FORMAT, FORMAT_VERSION, TableSpec, empty_value

log = logging.getLogger(__name__)


def attr_value(value: Any) -> Any:
    """HDF5 attributes hold scalars, strings and arrays; dicts become JSON text."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return np.array(value, dtype=h5py.string_dtype())
        if all(isinstance(v, (int, np.integer)) for v in value):
            return np.array(value, dtype="i8")
        return json.dumps(value, default=str)
    return value


class _Table:
    """Buffered rows of one table: `append` collects scalars, `extend` whole arrays (kept as
    arrays, so a generator or a batch append costs one copy, not one Python object a row)."""

    def __init__(self, group: h5py.Group, spec: TableSpec, filters: dict[str, Any], chunk: int):
        self.spec = spec
        self.datasets: dict[str, h5py.Dataset] = {}
        self.length = 0
        self.clear()
        for key, value in spec.attrs.items():
            group.attrs[key] = attr_value(value)
        for col in spec.columns:
            ds = group.create_dataset(
                col.name,
                shape=(0,),
                maxshape=(None,),
                chunks=(chunk,),
                dtype=np.dtype(col.dtype),
                **filters,
            )
            ds.attrs["units"] = col.units
            self.datasets[col.name] = ds

    def clear(self) -> None:
        self.rows: dict[str, list[Any]] = {c.name: [] for c in self.spec.columns}
        self.pieces: dict[str, list[np.ndarray]] = {c.name: [] for c in self.spec.columns}
        self._pending = 0

    def _seal(self) -> None:
        """Turn the scalars appended so far into one array piece per column."""
        if not self.rows[self.spec.columns[0].name]:
            return
        for col in self.spec.columns:
            self.pieces[col.name].append(np.asarray(self.rows[col.name], dtype=col.dtype))
            self.rows[col.name] = []

    def append(self, row: dict[str, Any]) -> None:
        for col in self.spec.columns:
            value = row.get(col.name)
            self.rows[col.name].append(empty_value(col.dtype) if value is None else value)
        self._pending += 1

    def extend(self, columns: dict[str, Any]) -> None:
        """Append many rows at once: column -> sequence (all the same length)."""
        n = len(next(iter(columns.values())))
        self._seal()
        for col in self.spec.columns:
            values = columns.get(col.name)
            if values is None:
                piece = np.full(n, empty_value(col.dtype), dtype=col.dtype)
            else:
                piece = np.array(values, dtype=col.dtype)  # a copy: the caller may reuse it
            self.pieces[col.name].append(piece)
        self._pending += n

    @property
    def pending(self) -> int:
        return self._pending

    def flush(self) -> None:
        n = self.pending
        if n == 0:
            return
        self._seal()
        end = self.length + n
        for col in self.spec.columns:
            ds = self.datasets[col.name]
            ds.resize((end,))
            pieces = self.pieces[col.name]
            ds[self.length : end] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            ds.flush()
        self.clear()
        self.length = end


class NodeFileWriter:
    def __init__(
        self,
        path: Path,
        specs: list[TableSpec],
        attrs: dict[str, Any],
        *,
        compression: str = "gzip",
        compression_level: int = 4,
        chunk_rows: int = 1024,
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.file = h5py.File(path, "w", libver="latest")
        self.file.attrs["format"] = FORMAT
        self.file.attrs["format_version"] = FORMAT_VERSION
        for key, value in attrs.items():
            self.file.attrs[key] = attr_value(value)
        filters: dict[str, Any] = {}
        if compression == "gzip":
            filters = {"compression": "gzip", "compression_opts": compression_level}
        elif compression == "lzf":
            filters = {"compression": "lzf"}
        if filters:
            filters["shuffle"] = True
        self.tables = {
            s.path: _Table(self.file.require_group(s.path), s, filters, chunk_rows) for s in specs
        }
        # Rows that could not be written (a full disk, a quota), per table, and the first
        # failure as one line: the agent tells its rank, the file's attrs tell the report.
        self.dropped: dict[str, int] = {}
        self.write_error: str | None = None
        self.file.swmr_mode = True
        self.file.flush()

    def append(self, table: str, row: dict[str, Any]) -> None:
        self.tables[table].append(row)

    def extend(self, table: str, columns: dict[str, Any]) -> None:
        self.tables[table].extend(columns)

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())

    def flush(self) -> None:
        """Write every buffered row; a table that fails is counted (its rows dropped, the
        first failure logged in one line) and the others still go."""
        for name, table in self.tables.items():
            try:
                table.flush()
            except Exception as exc:  # noqa: BLE001 - one bad table must not stop the others
                self._failed(name, table.pending, exc)
                table.clear()
        try:
            self.file.flush()
        except Exception as exc:  # noqa: BLE001
            self._failed("", 0, exc)

    def _failed(self, table: str, rows: int, exc: BaseException) -> None:
        if table:
            self.dropped[table] = self.dropped.get(table, 0) + rows
        if self.write_error is None:
            self.write_error = write_failure(exc)
            log.error(
                "telemetry: node file %s not written: %s; its rows are dropped until it is",
                self.path,
                self.write_error,
            )

    def note_dropped(self) -> None:
        """Name the rows that were never written in the file's attributes (best effort: the
        disk may still be full), as `<group>_absent_reason`, which the report shows."""
        by_group: dict[str, int] = {}
        for table, rows in self.dropped.items():
            group = table.split("/")[0]
            by_group[group] = by_group.get(group, 0) + rows
        for group, rows in by_group.items():
            try:
                self.file.attrs[f"{group}_absent_reason"] = (
                    f"partly: {rows} rows not written ({self.write_error})"
                )
            except Exception as exc:  # noqa: BLE001
                log.error("telemetry: could not note the dropped rows in %s: %s", self.path, exc)
                return

    def close(self) -> None:
        try:
            self.flush()
            if self.dropped:
                self.note_dropped()
        finally:
            try:
                self.file.close()
            except Exception as exc:  # noqa: BLE001 - the disk that failed the rows
                self._failed("", 0, exc)


_ERRNO_MESSAGE = re.compile(r"error message = '([^']+)'")


def write_failure(exc: BaseException) -> str:
    """A write failure in a few words: HDF5's errno text ("No space left on device") when it
    gives one, else the exception's first line."""
    text = str(exc)
    found = _ERRNO_MESSAGE.search(text)
    if found:
        return found.group(1)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"[:200]


def open_read(path: Path) -> h5py.File:
    """Open a node file for reading, whether its writer is running, finished or killed.

    A cleanly closed file opens normally (and a corrupt one fails at once); a file whose
    writer is still running, or was killed, carries HDF5's "open for SWMR write" flag and is
    opened as an SWMR reader. (SWMR readers retry failed metadata reads with back-off, so
    trying the plain open first keeps a truncated finished file from stalling the report.)"""
    try:
        return h5py.File(path, "r", libver="latest")
    except OSError as exc:
        if "open for write" not in str(exc) and "consistency flags" not in str(exc):
            raise
    return h5py.File(path, "r", libver="latest", swmr=True)
