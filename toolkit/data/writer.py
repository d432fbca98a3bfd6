"""Write a dataset directory atomically: everything goes to a temporary sibling directory,
renamed to OUT only once the manifest is written, so no reader ever sees half a dataset.

`DatasetWriter` takes the time axis in pieces (one source file at a time), so a source
larger than memory is converted holding one part file's worth of rows at once."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from toolkit.data.formats import write_part
from toolkit.data.manifest import (
    FORMATS,
    TIMES,
    DataError,
    Manifest,
    chunk_len_for,
    write_manifest,
)
from toolkit.data.moments import MOMENTS, per_chunk


class DatasetWriter:
    """with DatasetWriter(out, times, instruments, features) as w: w.append(values, mask)...
    Parts of `chunks_per_part` chunks stand for the date partitions of a shared filesystem.
    On an exception nothing is left behind; on success OUT appears whole."""

    def __init__(
        self,
        out: str | Path,
        times: np.ndarray,
        instruments: list[str],
        features: list[str],
        fmt: str = "hdf5",
        chunk_len: int | None = None,
        chunks_per_part: int = 8,
        time_unit: str | None = None,
    ):
        self.out = Path(out)
        self.time_unit = time_unit  # toolkit.data.manifest.Manifest.time_unit
        if fmt not in FORMATS:
            raise DataError(f"format={fmt}: unknown; allowed: {', '.join(FORMATS)}")
        if self.out.exists():
            raise DataError(
                f"{self.out}: already exists; remove it or choose another output directory"
            )
        self.times = np.asarray(times, dtype=np.int64)
        if len(self.times) > 1 and not (np.diff(self.times) > 0).all():
            raise DataError(
                f"{self.out}: the time index is not strictly increasing; sort the source"
            )
        self.instruments = [str(x) for x in instruments]
        self.features = list(features)
        self.fmt = fmt
        n, f = len(self.instruments), len(self.features)
        self.chunk_len = min(chunk_len or chunk_len_for(n, f), max(len(self.times), 1))
        self.part_len = self.chunk_len * chunks_per_part
        self.parts = []
        self.moments = []
        self.written = 0
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_len = 0
        self.tmp: Path | None = None

    def __enter__(self) -> DatasetWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.out.parent, prefix=f".{self.out.name}.tmp-"))
        return self

    def append(self, values: np.ndarray, mask: np.ndarray) -> None:
        """The next time steps, [time, instrument, feature] each."""
        shape = (len(self.instruments), len(self.features))
        if values.shape[1:] != shape or mask.shape != values.shape:
            raise DataError(
                f"{self.out}: inconsistent shapes: values {values.shape}, mask {mask.shape}, "
                f"{shape[0]} instruments, {shape[1]} features"
            )
        self._pending.append((values, mask))
        self._pending_len += len(values)
        while self._pending_len >= self.part_len:
            self._flush(self.part_len)

    def _flush(self, rows: int) -> None:
        values = np.concatenate([p[0] for p in self._pending])
        mask = np.concatenate([p[1] for p in self._pending])
        self._pending = [(values[rows:], mask[rows:])] if len(values) > rows else []
        self._pending_len = len(values) - rows
        v, m = values[:rows], mask[:rows]
        name = f"part-{len(self.parts):05d}"
        self.parts.append(
            write_part(self.fmt, self.tmp, name, v, m, self.written, self.chunk_len, self.features)
        )
        self.moments.append(per_chunk(v, m, self.chunk_len))
        self.written += rows

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._finish()
        finally:
            if self.tmp is not None and self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)

    def _finish(self) -> None:
        if self._pending_len:
            self._flush(self._pending_len)
        t = len(self.times)
        if self.written != t:
            raise DataError(f"{self.out}: {self.written} time steps written, {t} in the time index")
        np.save(self.tmp / TIMES, self.times)
        np.save(
            self.tmp / MOMENTS,
            np.concatenate(self.moments) if self.moments else np.zeros((0, 3, len(self.features))),
        )
        self.manifest = Manifest(
            format=self.fmt,
            shape=[t, len(self.instruments), len(self.features)],
            features=self.features,
            instruments=self.instruments,
            time_range=[int(self.times[0]), int(self.times[-1])] if t else [0, 0],
            chunk=[self.chunk_len, len(self.instruments), len(self.features)],
            parts=self.parts,
            moments=MOMENTS,
            time_unit=self.time_unit,
        )
        write_manifest(self.tmp, self.manifest)
        os.replace(self.tmp, self.out)


def write_dataset(
    out: str | Path,
    values: np.ndarray,
    mask: np.ndarray,
    times: np.ndarray,
    instruments: list[str],
    features: list[str],
    **options,
) -> Manifest:
    """A dataset held in memory: values, mask [time, instrument, feature]; times int64.
    options: DatasetWriter's (fmt, chunk_len, chunks_per_part)."""
    if len(times) != len(values):
        raise DataError(f"{out}: {len(values)} time steps of values, {len(times)} times")
    with DatasetWriter(out, times, instruments, features, **options) as w:
        w.append(values, mask)
    return w.manifest
