"""Chunk-cached reads of a dataset: any window of time steps, whatever the format.

Reads whole chunks (`manifest.chunk`), never single rows, and keeps the most recent ones in
an LRU cache bounded in bytes; each loader worker has its own reader (handles are opened
lazily, after the worker process starts, and dropped when pickled)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

from toolkit.data.formats import PartReader
from toolkit.data.manifest import TIMES, DataError, Manifest, check_files, read_manifest


def nonfinite_message(path: Path, values: np.ndarray, mask: np.ndarray, row0: int) -> str:
    """One line naming the first NaN or inf where the mask says observed (row0: the file
    row of values[0])."""
    bad = ~np.isfinite(values) & mask
    t, i, f = (int(x) for x in np.argwhere(bad)[0])
    kind = "NaN" if np.isnan(values[t, i, f]) else f"{values[t, i, f]:+}"
    return (
        f"{path}: {kind} at row {t + row0} (instrument {i}, feature {f}) where the mask says "
        f"observed; set the mask to 0 there (missing) or fix the value, then prepare the "
        f"dataset again"
    )


class DatasetReader:
    def __init__(
        self,
        root: str | Path,
        cache_bytes: int = 256 << 20,
        check: bool = True,
        refuse_nonfinite: bool = True,
    ):
        """refuse_nonfinite=False hands out NaN or inf where the mask says observed
        (`inspect` counts them and warns); training always refuses them."""
        self.root = Path(root)
        self.refuse_nonfinite = refuse_nonfinite
        self.manifest: Manifest = read_manifest(self.root)
        if check:
            check_files(self.root, self.manifest)
        self.times = np.load(self.root / TIMES)
        if len(self.times) != self.manifest.num_times:
            raise DataError(
                f"{self.root / TIMES}: {len(self.times)} entries, the manifest says "
                f"{self.manifest.num_times}; prepare the dataset again"
            )
        self.moments = self._load_moments()
        self.cache_bytes = cache_bytes
        self.bytes_read = 0
        self._readers: dict[int, PartReader] = {}
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._cached_bytes = 0
        self._part_of_chunk = {}
        c = self.manifest.chunk_len
        for i, part in enumerate(self.manifest.parts):
            if part.time_start % c:
                raise DataError(f"{self.root / part.path}: does not start on a chunk boundary")
            for k in range(part.time_start // c, -(-part.time_stop // c)):
                self._part_of_chunk[k] = i

    def _load_moments(self) -> np.ndarray | None:
        """Per-chunk moments [chunk, 3, feature] when prepare stored them."""
        m = self.manifest
        if m.moments is None:
            return None
        moments = np.load(self.root / m.moments)
        if len(moments) != -(-m.num_times // m.chunk_len):
            raise DataError(
                f"{self.root / m.moments}: {len(moments)} chunks, the manifest has "
                f"{-(-m.num_times // m.chunk_len)}; prepare the dataset again"
            )
        return moments

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_readers={}, _cache=OrderedDict(), _cached_bytes=0, bytes_read=0)
        return state

    def _reader(self, i: int) -> PartReader:
        if i not in self._readers:
            m = self.manifest
            self._readers[i] = PartReader(
                m.format, self.root, m.parts[i], m.features, m.chunk_len, m.shape[1]
            )
        return self._readers[i]

    def chunk(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Values and mask of chunk k (time steps [k*c, (k+1)*c) clipped to the part)."""
        hit = self._cache.get(k)
        if hit is not None:
            self._cache.move_to_end(k)
            return hit
        i = self._part_of_chunk[k]
        part = self.manifest.parts[i]
        c = self.manifest.chunk_len
        lo = k * c - part.time_start
        hi = min((k + 1) * c, part.time_stop) - part.time_start
        values, mask = self._reader(i).read(lo, hi)
        mask = mask.astype(bool)
        if self.refuse_nonfinite and not np.isfinite(values[mask]).all():
            raise DataError(nonfinite_message(self.root / part.path, values, mask, lo))
        size = values.nbytes + mask.nbytes
        self.bytes_read += size
        self._cache[k] = (values, mask)
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            _, (v, m) = self._cache.popitem(last=False)
            self._cached_bytes -= v.nbytes + m.nbytes
        return values, mask

    def window(self, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
        """Values and mask of time steps [t0, t1), [t1 - t0, instruments, features]."""
        c = self.manifest.chunk_len
        first, last = t0 // c, (t1 - 1) // c
        if first == last:
            v, m = self.chunk(first)
            return v[t0 - first * c : t1 - first * c], m[t0 - first * c : t1 - first * c]
        pieces = [self.chunk(k) for k in range(first, last + 1)]
        v = np.concatenate([p[0] for p in pieces])
        m = np.concatenate([p[1] for p in pieces])
        off = first * c
        return v[t0 - off : t1 - off], m[t0 - off : t1 - off]

    def iter_chunks(self, t0: int = 0, t1: int | None = None):
        """(first time step, values, mask) of every chunk overlapping [t0, t1), in order."""
        t1 = self.manifest.num_times if t1 is None else t1
        c = self.manifest.chunk_len
        for k in range(t0 // c, -(-t1 // c)):
            v, m = self.chunk(k)
            lo = max(t0, k * c) - k * c
            hi = min(t1, k * c + len(v)) - k * c
            yield k * c + lo, v[lo:hi], m[lo:hi]

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()
        self._cache.clear()
        self._cached_bytes = 0
