"""Reading a checkpoint without letting it run code in this process.

A DCP checkpoint holds pickles in two places: its `.metadata` (the index of every shard) and
the non-tensor items of its shards (the optimizer's `param_groups`: lr, betas, ...). Plain
unpickling of either runs whatever a crafted file names. Here the metadata is unpickled with
an explicit list of the globals honest DCP metadata refers to (recorded from the metadata
torch 2.13 and 2.15 write), and non-tensor items are read with `torch.load(weights_only=True)`,
which builds only plain values and tensors. Anything else is refused, before it is resolved,
with an `UnsafeCheckpoint` error naming the file. Paths inside the metadata are checked like
the manifest's (toolkit.checkpoint.manifest.file_in).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

_DCP = "torch.distributed.checkpoint"
_METADATA_GLOBALS = {
    (f"{_DCP}.metadata", "Metadata"),
    (f"{_DCP}.metadata", "MetadataIndex"),
    (f"{_DCP}.metadata", "StorageMeta"),
    (f"{_DCP}.metadata", "TensorProperties"),
    (f"{_DCP}.metadata", "TensorStorageMetadata"),
    (f"{_DCP}.metadata", "ChunkStorageMetadata"),
    (f"{_DCP}.metadata", "BytesStorageMetadata"),
    (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"),
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch.serialization", "_get_layout"),  # maps a layout name to torch.strided etc.
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "PurePosixPath"),
    ("pathlib._local", "PosixPath"),  # the same classes pickled by Python >= 3.13
    ("pathlib._local", "PurePosixPath"),
}
# dtypes, layouts and memory formats: torch.float32, torch.strided, torch.contiguous_format...
_TORCH_ENUMS = {
    ("torch", name)
    for name, value in vars(torch).items()
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format))
}
SAFE_GLOBALS = frozenset(_METADATA_GLOBALS | _TORCH_ENUMS)


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint file holds a pickle that would build more than checkpoint data."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's `.metadata` at `path`, resolving only `SAFE_GLOBALS`. A dotted name is
    refused too: pickle resolves it attribute by attribute (`os.system` from any module that
    imports os)."""

    def __init__(self, file: Any, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if "." in name or (module, name) not in SAFE_GLOBALS:
            raise UnsafeCheckpoint(
                f"{self.path}: refers to {module}.{name}, which is not a DCP metadata type; "
                "refusing to load it"
            )
        return super().find_class(module, name)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor items with weights_only=True (DCP's
    own reads them with weights_only=False). `directory` is the checkpoint's, for errors."""

    def __init__(self, directory: Path, **kwargs: Any):
        super().__init__(**kwargs)
        self.directory = directory

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            item = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpoint(
                f"{self._file_of(read_item)}: item {read_item.dest_index.fqn!r} is not plain data "
                f"({_offending_line(exc)}); refusing to load it"
            ) from None
        # Hand DCP the item re-pickled from plain values: its own load (weights_only=False)
        # then sees nothing but what weights_only=True already admitted.
        plain = io.BytesIO()
        torch.save(item, plain)
        plain.seek(0)
        super().load_bytes(read_item, plain)

    def _file_of(self, read_item: ReadItem) -> Path | str:
        storage = getattr(self.metadata, "storage_data", None) or {}
        info = storage.get(read_item.storage_index)
        relative = getattr(info, "relative_path", None)
        return self.directory / relative if relative else self.directory


def _offending_line(exc: Exception) -> str:
    """The line of torch's weights_only error that names what was refused."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "Unsupported" in line]
    return (named or lines or [type(exc).__name__])[0]


def first_unsafe(exc: BaseException) -> UnsafeCheckpoint | None:
    """The UnsafeCheckpoint behind `exc` (DCP wraps each rank's error in a
    CheckpointException), or None."""
    stack: list[Any] = [exc]
    seen: list[BaseException] = []
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or e in seen:
            continue
        seen.append(e)
        if isinstance(e, UnsafeCheckpoint):
            return e
        stack += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)  # DCP CheckpointException: rank -> exception
        if isinstance(failures, dict):
            stack += [v[0] if isinstance(v, tuple) else v for v in failures.values()]
    return None
