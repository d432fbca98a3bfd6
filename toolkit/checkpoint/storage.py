"""Where checkpoints live, behind a small interface so that faults can be injected.

`LocalStorage` is a POSIX directory tree. `FaultyStorage` is the same with injected write
faults (ENOSPC after N bytes, or a stall), used by tests through checkpoint.fault_* settings.
DCP reads and writes go through `dcp_writer` / `dcp_reader`; the reader loads DCP's
`.metadata` with a restricted unpickler so that a checkpoint cannot run arbitrary code.
The writer skips the zip CRC-32 that `torch.save` computes per tensor (it cost ~1 s of CPU
per GB here; the manifest's checksums cover every file) and remembers the files it wrote,
so that each rank checksums its own shards.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import shutil
import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch.utils.serialization
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner

from toolkit.checkpoint.priority import describe_this_thread, lower_this_thread


class Storage(Protocol):
    def list(self, path: Path) -> list[str]: ...

    def exists(self, path: Path) -> bool: ...

    def remove(self, path: Path) -> None: ...

    def write_bytes(self, path: Path, data: bytes) -> None: ...

    def rename(self, src: Path, dst: Path) -> None: ...

    def dcp_writer(self, path: Path) -> ShardWriter: ...

    def dcp_reader(self, path: Path) -> FileSystemReader: ...


class LocalStorage:
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
        fd = os.open(dst.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # make the rename itself durable
        finally:
            os.close(fd)

    def dcp_writer(self, path: Path) -> ShardWriter:
        writer = ShardWriter(path, single_file_per_rank=True, sync_files=True, overwrite=True)
        writer.fs = GuardedFileSystem()
        return writer

    def dcp_reader(self, path: Path) -> FileSystemReader:
        return SafeFileSystemReader(path)


class _GuardedStream(io.RawIOBase):
    """A write stream that records the first OSError (torch.save would otherwise hide a
    disk-full error behind a zip-writer RuntimeError) and enforces an injected byte budget."""

    def __init__(self, inner: Any, fs: GuardedFileSystem, path: Path):
        self._inner = inner
        self._fs = fs
        self._path = path

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        try:
            if self._fs.budget_bytes is not None:
                if size > self._fs.budget_bytes:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self._path))
                self._fs.budget_bytes -= size
            return self._inner.write(data)
        except OSError as exc:
            if self._fs.error is None:
                self._fs.error = (
                    exc if exc.filename else OSError(exc.errno, exc.strerror, str(self._path))
                )
            raise

    def flush(self) -> None:
        self._inner.flush()

    def fileno(self) -> int:
        return self._inner.fileno()

    def tell(self) -> int:
        return self._inner.tell()

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._inner.seek(offset, whence)


class ShardWriter(FileSystemWriter):
    """DCP's FileSystemWriter without torch.save's per-tensor CRC-32, whose background
    thread (when `background_priority` is set) lowers its own scheduling priority."""

    background_priority: str | None = None  # set for async saves: see toolkit.checkpoint.priority
    thread_priority: str | None = None  # what the writing thread ran at (reported in events)

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
            return super().write_data(plan, planner)
        finally:
            config.compute_crc32 = saved

    @property
    def written(self) -> list[Path]:
        """Files this rank's writer created (its shards; rank 0 also `.metadata`)."""
        return list(getattr(self.fs, "written", []))


class GuardedFileSystem(FileSystem):
    """DCP's file system layer, remembering the first write error (`error`) and the files
    it created (`written`), with optional injected faults: a byte budget (then ENOSPC) and
    a stall before each file is opened."""

    def __init__(self, budget_bytes: int | None = None, stall_s: float = 0.0):
        self.budget_bytes = budget_bytes
        self.stall_s = stall_s
        self.error: OSError | None = None
        self.written: list[Path] = []

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" in mode and self.stall_s > 0:
            time.sleep(self.stall_s)
        if "w" in mode:
            self.written.append(Path(path))
        with super().create_stream(path, mode) as stream:
            yield _GuardedStream(stream, self, Path(path)) if "w" in mode else stream


class FaultyStorage(LocalStorage):
    """LocalStorage whose DCP writes fail with ENOSPC after `enospc_after_bytes` bytes per
    checkpoint and rank, or stall `stall_s` seconds before each file is opened."""

    def __init__(self, enospc_after_bytes: int | None = None, stall_s: float = 0.0):
        self.enospc_after_bytes = enospc_after_bytes
        self.stall_s = stall_s

    def dcp_writer(self, path: Path) -> ShardWriter:
        writer = super().dcp_writer(path)
        writer.fs = GuardedFileSystem(self.enospc_after_bytes, self.stall_s)
        return writer


# DCP's .metadata is a pickle of these classes only (plus builtins); nothing else may load.
_SAFE_MODULE_PREFIXES = ("torch.distributed.checkpoint.",)
_SAFE_GLOBALS = {
    ("torch", "Size"),
    ("torch", "device"),
    ("collections", "OrderedDict"),
    ("torch.serialization", "_get_layout"),  # maps a layout name to torch.strided etc.
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "PurePosixPath"),
}
_SAFE_TORCH_ENUMS = ("dtype", "layout", "memory_format")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_SAFE_MODULE_PREFIXES) or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if type(value).__name__ in _SAFE_TORCH_ENUMS:
                return value
        raise pickle.UnpicklingError(
            f"checkpoint metadata refers to {module}.{name}, which is not a DCP metadata type; "
            "refusing to load it"
        )


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose .metadata unpickling admits only DCP metadata types."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path}: not DCP metadata ({type(metadata).__name__})")
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
