"""Tables on the training device, whole or streamed in chunks of steps, the next chunk's copy
overlapping the current chunk's steps (double buffering).

A chunk is what the steps [k * S, (k + 1) * S) read: the table rows they need (gathered from
host memory, page-locked on CUDA) and, per sample of those steps, the row it is cut at,
renumbered into the chunk, and its sub-index (an instrument, or none). Which rows chunk k
needs follows the seeded sample order (toolkit.data.samples.SampleOrder), so a chunk is a
pure function of (seed, k): a resume needs only the step. Resident tables are one chunk of
every row, copied once; their chunks carry only the samples' rows.

On CUDA a side stream copies chunk k + 1 while chunk k trains, and the training stream waits
on its event before the first gather; on CPU the gather itself is the copy, made by one
background thread. At most two chunks are alive: the one in use and the one on its way.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# chunk k -> (the table rows it reads, None: the resident tables; each sample's row in the
# chunk; each sample's sub-index or None)
ChunkPlan = Callable[[int], tuple[np.ndarray | None, np.ndarray, np.ndarray | None]]


@dataclass
class Chunk:
    index: int
    tables: list[torch.Tensor]  # on the device
    rows: torch.Tensor  # [samples] int64 on the device: each sample's row in `tables`
    subs: torch.Tensor | None  # [samples] int64 on the device, or None
    ready: Any = None  # a CUDA event: the copy is done once the consuming stream waits on it
    sources: list[torch.Tensor] = field(default_factory=list)  # host buffers of the copy
    copied: bool = False  # tables copied for this chunk (not the resident ones)


def window_rows(rows: np.ndarray, window: int, num_rows: int) -> np.ndarray:
    """The sorted table rows that samples cut at `rows` read: [row - window + 1, row] each.
    Each window is then contiguous in the result (every row between its ends is there)."""
    marks = np.zeros(num_rows + 1, np.int64)
    np.add.at(marks, rows - window + 1, 1)
    np.add.at(marks, rows + 1, -1)
    return np.flatnonzero(np.cumsum(marks[:num_rows]) > 0)


class ChunkStream:
    """Chunks of `host` tables on `device`, chunk k + 1 prepared while chunk k is in use."""

    def __init__(
        self,
        host: list[torch.Tensor],
        plan: ChunkPlan,
        device: torch.device,
        resident: list[torch.Tensor] | None = None,
    ):
        self.host = host
        self.plan = plan
        self.device = device
        self.resident = resident
        self.cuda = device.type == "cuda"
        self.bytes_copied = 0
        self._side = torch.cuda.Stream(device) if self.cuda else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="data-chunks")
        self._pending: tuple[int, Future] | None = None

    def _load(self, k: int) -> Chunk:
        rows, keys, subs = self.plan(k)
        index = [torch.from_numpy(keys)] + ([torch.from_numpy(subs)] if subs is not None else [])
        tables = self.resident or []
        sources = []
        if rows is not None:
            picked = torch.from_numpy(rows)
            for t in self.host:
                out = torch.empty((len(rows), *t.shape[1:]), dtype=t.dtype, pin_memory=self.cuda)
                sources.append(torch.index_select(t, 0, picked, out=out))
            self.bytes_copied += sum(s.nbytes for s in sources)
        if self.device.type == "cpu":  # the gather was the copy
            tables = sources if rows is not None else tables
            return Chunk(k, tables, index[0], index[1] if subs is not None else None)
        ready = None
        if self.cuda:
            index = [i.pin_memory() for i in index]
            with torch.cuda.device(self.device), torch.cuda.stream(self._side):
                moved = [s.to(self.device, non_blocking=True) for s in sources + index]
                ready = torch.cuda.Event()
                ready.record(self._side)
        else:
            moved = [s.to(self.device) for s in sources + index]
        tables = moved[: len(sources)] if rows is not None else tables
        on_device = moved[len(sources) :]
        subs_t = on_device[1] if subs is not None else None
        copied = rows is not None
        return Chunk(k, tables, on_device[0], subs_t, ready, sources + index, copied)

    def get(self, k: int) -> Chunk:
        """Chunk k, ready for the current stream; starts preparing chunk k + 1."""
        if self._pending is not None and self._pending[0] == k:
            future = self._pending[1]
            self._pending = None
        else:
            self._drop_pending()
            future = self._pool.submit(self._load, k)
        chunk = future.result()
        if chunk.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(chunk.ready)
            copied = chunk.tables if chunk.copied else []
            for t in [*copied, chunk.rows, *([chunk.subs] if chunk.subs is not None else [])]:
                t.record_stream(stream)  # freed only after the training stream used it
        self._pending = (k + 1, self._pool.submit(self._load, k + 1))
        return chunk

    def _drop_pending(self) -> None:
        if self._pending is None:
            return
        _, future = self._pending
        self._pending = None
        chunk = future.result()  # a running copy cannot be cancelled: let it finish
        if chunk.ready is not None:
            chunk.ready.synchronize()

    def close(self) -> None:
        self._drop_pending()
        self._pool.shutdown(wait=True)
