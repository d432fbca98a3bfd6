"""Part files in three formats, written and read by the same code.

Each part holds values [time, instrument, feature] (float32, NaN where unobserved) and a
mask (1 = observed) for a contiguous range of time steps:

- hdf5: datasets `values` and `mask`, chunked [chunk_len, instruments, features],
  uncompressed (decompression would cost more CPU than a shared filesystem's read).
- parquet: long format, one row per (time, instrument), one float32 column per feature,
  null where unobserved; one row group per chunk, so a chunk is one row-group read.
- npy: `<part>.values.npy` and `<part>.mask.npy`, memory-mapped (no chunking on disk).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.data.manifest import DataError, Part

EXTENSIONS = {"hdf5": ".h5", "parquet": ".parquet", "npy": ".values.npy"}


def write_part(
    fmt: str,
    root: Path,
    name: str,
    values: np.ndarray,
    mask: np.ndarray,
    time_start: int,
    chunk_len: int,
    features: list[str],
) -> Part:
    """Write one part (values NaN where mask is 0) and return its manifest entry."""
    values = np.where(mask.astype(bool), values, np.nan).astype(np.float32)
    mask = mask.astype(np.uint8)
    rel = name + EXTENSIONS[fmt]
    extra: list[str] = []
    if fmt == "hdf5":
        import h5py

        t, n, f = values.shape
        chunks = (min(chunk_len, t), n, f)
        with h5py.File(root / rel, "w") as h5:
            h5.create_dataset("values", data=values, chunks=chunks)
            h5.create_dataset("mask", data=mask, chunks=chunks)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        t, n, f = values.shape
        flat = values.reshape(t * n, f)
        observed = mask.reshape(t * n, f).astype(bool)
        columns = {
            "time": pa.array(np.repeat(np.arange(time_start, time_start + t), n)),
            "instrument": pa.array(np.tile(np.arange(n, dtype=np.int32), t)),
        }
        for j, feature in enumerate(features):
            columns[feature] = pa.array(flat[:, j], mask=~observed[:, j], type=pa.float32())
        pq.write_table(pa.table(columns), root / rel, row_group_size=chunk_len * n)
    elif fmt == "npy":
        np.save(root / rel, values)
        extra = [name + ".mask.npy"]
        np.save(root / extra[0], mask)
    else:
        raise ValueError(f"format={fmt}: unknown")
    size = (root / rel).stat().st_size
    return Part(rel, time_start, time_start + values.shape[0], size, extra)


class PartReader:
    """Reads rows [lo, hi) of one part (local row numbers) as (values, mask)."""

    def __init__(
        self,
        fmt: str,
        root: Path,
        part: Part,
        features: list[str],
        chunk_len: int,
        num_instruments: int,
    ):
        self.fmt = fmt
        self.num_instruments = num_instruments
        self.path = root / part.path
        self.part = part
        self.features = features
        self.chunk_len = chunk_len
        self._handle = None
        self._mask = None

    def _open(self):
        try:
            if self.fmt == "hdf5":
                import h5py

                self._handle = h5py.File(self.path, "r")
            elif self.fmt == "parquet":
                import pyarrow.parquet as pq

                self._handle = pq.ParquetFile(self.path)
            else:
                self._handle = np.load(self.path, mmap_mode="r")
                self._mask = np.load(self.path.parent / self.part.extra[0], mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise DataError(
                f"{self.path}: cannot be read ({type(exc).__name__}: {exc}); restore it or "
                f"prepare the dataset again"
            ) from exc

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        if self._handle is None:
            self._open()
        try:
            if self.fmt == "hdf5":
                values = self._handle["values"][lo:hi]
                mask = self._handle["mask"][lo:hi]
            elif self.fmt == "parquet":
                values, mask = self._read_parquet(lo, hi)
            else:
                values = np.asarray(self._handle[lo:hi])
                mask = np.asarray(self._mask[lo:hi])
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(
                f"{self.path}: rows {lo}..{hi} cannot be read ({type(exc).__name__}: {exc}); "
                f"the file is damaged: restore it or prepare the dataset again"
            ) from exc
        return values, mask

    def _read_parquet(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow.compute as pc

        groups = list(range(lo // self.chunk_len, (hi - 1) // self.chunk_len + 1))
        table = self._handle.read_row_groups(groups, columns=self.features)
        rows = table.num_rows
        values = np.empty((rows, len(self.features)), np.float32)
        mask = np.empty((rows, len(self.features)), np.uint8)
        for j, feature in enumerate(self.features):
            col = table.column(feature)
            values[:, j] = col.to_numpy()
            mask[:, j] = pc.is_valid(col).to_numpy(zero_copy_only=False)
        first = groups[0] * self.chunk_len
        values = values.reshape(-1, self.num_instruments, len(self.features))
        mask = mask.reshape(-1, self.num_instruments, len(self.features))
        return values[lo - first : hi - first], mask[lo - first : hi - first]

    def close(self) -> None:
        if self._handle is not None and hasattr(self._handle, "close"):
            self._handle.close()
        self._handle = None
        self._mask = None
