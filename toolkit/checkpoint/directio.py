"""Shard files written around the page cache (O_DIRECT), for checkpoints.

Written through the page cache, every byte of a checkpoint is copied into the cache by the
writing thread and later written back by the kernel's flusher threads, on CPUs that training
wants; with O_DIRECT the disk copies from user memory, for a small fraction of that kernel
CPU (figures: docs/BENCHMARKS.md, Issue 4). See docs/checkpoint.md.

`DirectFile` gathers writes in a page-aligned buffer (O_DIRECT needs aligned memory, sizes and
offsets) and writes it out whole; the tail that does not fill a block is written after
O_DIRECT is switched off for the file, so the file holds exactly the bytes written and no
padding. `open_for_write` falls back to an ordinary buffered file on filesystems that refuse
O_DIRECT (tmpfs, some FUSE mounts).
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np

ALIGN = 4096  # covers 512-byte and 4K logical blocks
BUFFER_BYTES = 8 << 20  # one write to the disk per 8 MiB: large enough to stream, small in memory
_PIECE = 1 << 20  # copied and checksummed at a time: still in the CPU cache for the checksum


class DirectFile(io.RawIOBase):
    """A write-only, sequential file opened with O_DIRECT. `close` writes the tail and fsyncs
    (callers that fsync before closing, like DCP, would otherwise miss the tail)."""

    def __init__(
        self, path: str | os.PathLike, buffer_bytes: int = BUFFER_BYTES, checksum: Any = None
    ):
        if buffer_bytes <= 0 or buffer_bytes % ALIGN:
            raise ValueError(f"buffer_bytes={buffer_bytes}: must be a positive multiple of {ALIGN}")
        self._buffer = mmap.mmap(-1, buffer_bytes)  # anonymous mappings are page-aligned
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_DIRECT
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError:
            self._buffer.close()
            raise
        self._array = np.frombuffer(self._buffer, dtype=np.uint8)  # os.write takes it as is
        self._fill = 0
        self._pos = 0
        self.checksum = checksum  # updated with every byte written, if given

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        # numpy copies (and xxhash hashes) without holding the GIL, which the training
        # thread needs; each piece is checksummed right after its copy, while in the cache.
        src = np.frombuffer(data, dtype=np.uint8)
        size = len(src)
        done = 0
        capacity = len(self._array)
        while done < size:
            take = min(size - done, capacity - self._fill, _PIECE)
            piece = self._array[self._fill : self._fill + take]
            piece[:] = src[done : done + take]
            if self.checksum is not None:
                self.checksum.update(piece)
            self._fill += take
            done += take
            if self._fill == capacity:
                self._write_out(capacity)
                self._fill = 0
        self._pos += size
        return size

    def flush(self) -> None:
        """Nothing to do: whole buffers go out as they fill, the tail at close."""

    def _write_out(self, size: int) -> None:
        done = 0
        while done < size:
            written = os.write(self._fd, self._array[done:size])
            if written <= 0:  # the kernel reports a full disk as an error, not as 0
                raise OSError(errno.EIO, "write returned 0")
            done += written
            if done < size:  # short (disk full?): the rest is unaligned, so that the
                self._buffered()  # next write reports the real error (ENOSPC), not EINVAL

    def _buffered(self) -> None:
        """Switch O_DIRECT off for the rest of the file."""
        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._fill:
                whole = self._fill - self._fill % ALIGN
                if whole:
                    self._write_out(whole)
                    self._array[: self._fill - whole] = self._array[whole : self._fill]
                    self._fill -= whole
                if self._fill:  # the unaligned tail: buffered, so no padding reaches the file
                    self._buffered()
                    self._write_out(self._fill)
                    self._fill = 0
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            del self._array  # a buffer export: the mapping cannot close while it lives
            # After a failed write, the traceback may still hold a view of the buffer; the
            # mapping is then unmapped when that goes.
            with suppress(BufferError):
                self._buffer.close()
            super().close()


def open_for_write(
    path: str | os.PathLike, direct: bool, checksum: Any = None
) -> tuple[io.RawIOBase | Any, bool]:
    """A new file for sequential writing, and whether it is a DirectFile (which then updates
    `checksum` itself). With `direct`, O_DIRECT where the filesystem allows it (EINVAL: it
    does not), else an ordinary buffered file."""
    if direct:
        try:
            return DirectFile(path, checksum=checksum), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return Path(path).open("wb"), False
