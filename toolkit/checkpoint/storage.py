"""Where checkpoints live, behind a small interface so that faults can be injected.

`LocalStorage` is a POSIX directory tree. `FaultyStorage` is the same with injected write
faults (ENOSPC after N bytes, or a stall), used by tests through the fault.save_* settings.
DCP reads and writes go through `dcp_writer` / `dcp_reader`; the reader loads DCP's
`.metadata` with a restricted unpickler so that a checkpoint cannot run arbitrary code
(toolkit.checkpoint.trust). `sync_tree` makes the names of a save's files durable before
the commit renames its directory.
The writer skips the zip CRC-32 that `torch.save` computes per tensor (most of DCP's CPU
per GB written, see docs/BENCHMARKS.md, Issue 4; the manifest's checksums cover every file),
writes shards around the page cache (O_DIRECT, see toolkit.checkpoint.directio) unless told
not to, checksums each file as it writes it, so that no rank reads its shards back to
checksum them, and writes each tensor from its torch.save archive's frame, learnt once per
layout, instead of pickling it every save (toolkit.checkpoint.serialization): the same bytes
as DCP's writer.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import time
from collections.abc import Generator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

import torch.utils.serialization
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import (
    DEFAULT_SUFFIX,
    FileSystem,
    SerializationFormat,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from toolkit.checkpoint import compat
from toolkit.checkpoint.directio import open_for_write
from toolkit.checkpoint.manifest import CHECKSUM, FileEntry, file_in, new_hash
from toolkit.checkpoint.priority import describe_this_thread, lower_this_thread
from toolkit.checkpoint.serialization import FRAMES, FrameCache
from toolkit.checkpoint.trust import MetadataUnpickler, UnsafeCheckpoint


class Storage(Protocol):
    def list(self, path: Path) -> list[str]: ...

    def exists(self, path: Path) -> bool: ...

    def remove(self, path: Path) -> None: ...

    def write_bytes(self, path: Path, data: bytes) -> None: ...

    def rename(self, src: Path, dst: Path) -> None: ...

    def sync_tree(self, path: Path) -> None: ...

    def dcp_writer(self, path: Path) -> ShardWriter: ...

    def dcp_reader(self, path: Path) -> FileSystemReader: ...


class LocalStorage:
    """Checkpoints in a local or shared POSIX filesystem; with `direct_io`, DCP shards are
    written with O_DIRECT where the filesystem supports it; with `cache_headers`, tensors are
    written from cached torch.save frames (toolkit.checkpoint.serialization)."""

    def __init__(self, direct_io: bool = True, cache_headers: bool = True):
        self.direct_io = direct_io
        self.cache_headers = cache_headers

    def list(self, path: Path) -> list[str]:
        return sorted(os.listdir(path)) if path.is_dir() else []

    def exists(self, path: Path) -> bool:
        return path.exists()

    def remove(self, path: Path) -> None:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()

    def write_bytes(self, path: Path, data: bytes) -> None:
        """Write-then-rename, fsynced: a reader sees the old file or the whole new one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)  # atomic within one filesystem; fails if dst exists and is not empty
        _fsync_dir(dst.parent)  # make the rename itself durable

    def sync_tree(self, path: Path) -> None:
        """fsync every directory under `path`, deepest first, then `path` itself: a file's
        data is durable once fsynced, its name only once its directory is."""
        subdirs = [p for p in path.rglob("*") if p.is_dir() and not p.is_symlink()]
        for directory in sorted(subdirs, key=lambda p: len(p.parts), reverse=True):
            _fsync_dir(directory)
        _fsync_dir(path)

    def dcp_writer(self, path: Path) -> ShardWriter:
        writer = ShardWriter(path, single_file_per_rank=True, sync_files=True, overwrite=True)
        writer.fs = GuardedFileSystem(direct=self.direct_io)
        writer.frames = FRAMES if self.cache_headers else None
        return writer

    def dcp_reader(self, path: Path) -> FileSystemReader:
        return SafeFileSystemReader(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _GuardedStream(io.RawIOBase):
    """A write stream that records the first OSError (torch.save would otherwise hide a
    disk-full error behind a zip-writer RuntimeError), enforces an injected byte budget and
    checksums what it writes (DCP writes each file sequentially, start to end)."""

    def __init__(self, inner: Any, fs: GuardedFileSystem, path: Path, checksum: Any):
        self._inner = inner
        self._fs = fs
        self._path = path
        self.checksum = checksum  # None: the inner file checksums what it writes
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        try:
            if self._fs.budget_bytes is not None:
                if size > self._fs.budget_bytes:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self._path))
                self._fs.budget_bytes -= size
            written = self._inner.write(data)
        except OSError as exc:
            self._fs.record(exc, self._path)
            raise
        if self.checksum is not None:
            self.checksum.update(data)
        self.size += size
        return written

    def flush(self) -> None:
        self._inner.flush()

    def fileno(self) -> int:
        return self._inner.fileno()

    def tell(self) -> int:
        return self._inner.tell()

    def seekable(self) -> bool:
        return False  # a seek back would make the running checksum wrong


class ShardWriter(FileSystemWriter):
    """DCP's FileSystemWriter without torch.save's per-tensor CRC-32, whose background
    thread (when `background_priority` is set) lowers its own scheduling priority."""

    background_priority: str | None = None  # set for async saves: see toolkit.checkpoint.priority
    thread_priority: str | None = None  # what the writing thread ran at (reported in events)
    frames: FrameCache | None = None  # set: tensors are written from cached torch.save frames

    def set_up_storage_writer(self, *args: Any, **kwargs: Any) -> None:
        if self.background_priority is not None:  # the first call in DCP's save thread
            lower_this_thread(self.background_priority)
        self.thread_priority = describe_this_thread()
        super().set_up_storage_writer(*args, **kwargs)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        # A process-wide setting, off only while this rank writes its shards (at most one
        # save is in flight); a torch.save elsewhere meanwhile just omits the optional CRC.
        config = torch.utils.serialization.config.save
        saved, config.compute_crc32 = config.compute_crc32, False
        try:
            if self.frames is not None and self._one_plain_file():
                return self._write_one_file(plan, planner, self.frames)
            return super().write_data(plan, planner)
        finally:
            config.compute_crc32 = saved

    def _one_plain_file(self) -> bool:
        """Whether DCP would write this rank's shards as one file of plain torch.save
        archives, in one thread (the only layout `_write_one_file` reproduces)."""
        return (
            self.single_file_per_rank
            and self.thread_count == 1
            and self.serialization_format == SerializationFormat.TORCH_SAVE
            and not getattr(getattr(self, "transforms", None), "extensions", None)
            and compat.storage_info() is not None  # private to DCP: else DCP's writer
        )

    def _write_one_file(
        self, plan: SavePlan, planner: SavePlanner, frames: FrameCache
    ) -> Future[list[WriteResult]]:
        """DCP's write of one rank's shards (`FileSystemWriter.write_data` with one file and
        one thread): the byte items, then every tensor as a torch.save archive, each
        recorded at its offset; the same bytes, with tensors written by `frames`."""
        storage_info = compat.storage_info()
        key = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
        items = [i for i in plan.items if i.type == WriteItemType.BYTE_IO]
        items += [i for i in plan.items if i.type != WriteItemType.BYTE_IO]
        results = []
        with self.fs.create_stream(self.fs.concat_path(self.path, key), "wb") as stream:
            for item in items:
                offset = stream.tell()
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    stream.write(data.getbuffer())
                else:
                    tensor = data.detach().cpu()
                    if tensor.untyped_storage().nbytes() != tensor.nbytes:
                        tensor = tensor.clone()  # a view: save only its elements, as DCP does
                    frames.save(tensor, stream)
                length = stream.tell() - offset
                info = storage_info(key, offset, length)
                results.append(
                    WriteResult(index=item.index, size_in_bytes=length, storage_data=info)
                )
            if self.sync_files:
                try:
                    os.fsync(stream.fileno())
                except (AttributeError, io.UnsupportedOperation):
                    os.sync()  # a stream without a file descriptor: as DCP's writer does
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    @property
    def written(self) -> dict[Path, FileEntry]:
        """Files this rank's writer completed (its shards; rank 0 also `.metadata.tmp`, which
        DCP then renames), with the size and checksum of the bytes written."""
        return dict(getattr(self.fs, "written", {}))

    @property
    def direct_io(self) -> bool | None:
        """Whether the shards bypassed the page cache (None: nothing written yet)."""
        return getattr(self.fs, "direct_used", None)


class GuardedFileSystem(FileSystem):
    """DCP's file system layer, writing with O_DIRECT when `direct` and the filesystem allow,
    remembering the first write error (`error`) and the files it wrote (`written`, with size
    and checksum), with optional injected faults: a byte budget (then ENOSPC) and a stall
    before each file is opened."""

    def __init__(self, budget_bytes: int | None = None, stall_s: float = 0.0, direct: bool = True):
        self.budget_bytes = budget_bytes
        self.stall_s = stall_s
        self.direct = direct
        self.direct_used: bool | None = None
        self.error: OSError | None = None
        self.written: dict[Path, FileEntry] = {}

    def record(self, exc: OSError, path: Path) -> None:
        if self.error is None:
            self.error = exc if exc.filename else OSError(exc.errno, exc.strerror, str(path))

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        if self.stall_s > 0:
            time.sleep(self.stall_s)
        path = Path(path)
        checksum = new_hash(CHECKSUM)
        try:
            inner, direct = open_for_write(path, self.direct, checksum)
        except OSError as exc:
            self.record(exc, path)
            raise
        self.direct_used = direct if self.direct_used is None else self.direct_used and direct
        stream = _GuardedStream(inner, self, path, None if direct else checksum)
        try:
            yield stream
            inner.close()  # DirectFile: writes the tail and fsyncs
        except OSError as exc:
            self.record(exc, path)
            raise
        finally:
            if not inner.closed:  # after an error: release the file; it is discarded anyway
                with suppress(OSError):
                    inner.close()
        self.written[path] = FileEntry(stream.size, checksum.hexdigest())


class FaultyStorage(LocalStorage):
    """LocalStorage whose DCP writes fail with ENOSPC after `enospc_after_bytes` bytes per
    checkpoint and rank, or stall `stall_s` seconds before each file is opened."""

    def __init__(
        self,
        enospc_after_bytes: int | None = None,
        stall_s: float = 0.0,
        direct_io: bool = True,
        cache_headers: bool = True,
    ):
        super().__init__(direct_io, cache_headers)
        self.enospc_after_bytes = enospc_after_bytes
        self.stall_s = stall_s

    def dcp_writer(self, path: Path) -> ShardWriter:
        writer = super().dcp_writer(path)
        writer.fs = GuardedFileSystem(self.enospc_after_bytes, self.stall_s, self.direct_io)
        return writer


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose .metadata unpickling admits only DCP metadata types
    (toolkit.checkpoint.trust) and whose shard paths must lie inside the checkpoint."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(compat.metadata_path(self, kwargs.get("rank")))
        with self.fs.create_stream(path, "rb") as f:
            metadata = MetadataUnpickler(f, path).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpoint(f"{path}: not DCP metadata ({type(metadata).__name__})")
        for info in (metadata.storage_data or {}).values():
            relative = getattr(info, "relative_path", None)
            if relative is not None:
                file_in(Path(self.path), str(relative), path)
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
