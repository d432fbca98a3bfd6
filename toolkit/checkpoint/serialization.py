"""Writing a tensor in `torch.save`'s format without pickling it every save.

DCP's writer stores every tensor of a shard file as one `torch.save` archive: a zip file of
a pickle naming the tensor's dtype, shape and strides, a few small records, and the
storage's bytes. Building it costs Python and ~40 small writes per tensor (each through
three stream layers), all holding the GIL that the training thread needs, on every save
(see docs/BENCHMARKS.md, Issue 4). Without the per-record CRC-32 (which the
toolkit's writer turns off: the manifest checksums every file), everything around the
storage's bytes depends only on the tensor's layout, never on its values.

`FrameCache` learns that frame once per layout, from a real `torch.save` written through to
the file, and afterwards writes the same archive as prefix + storage bytes + suffix: the
files are byte for byte what `torch.save` writes (tests/checkpoint/test_serialization.py
compares them with DCP's own writer). Anything it does not recognise as a plain dense CPU
tensor, or a save whose frame it could not find, goes through `torch.save`.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
import torch.utils.serialization

from toolkit.checkpoint.staging import as_bytes

MAX_LAYOUTS = 4096  # frames kept (~1 KB each); beyond that new layouts use torch.save
_MAX_FRAME_WRITE = 1 << 16  # a larger write that is not the storage's bytes: no frame learnt

Layout = tuple[Any, ...]


def layout_of(tensor: torch.Tensor) -> Layout | None:
    """Everything `torch.save` puts into a tensor's archive besides its bytes, or None for a
    tensor whose archive may depend on more (subclasses, names, Python attributes, quantized
    or sparse layouts, empty storages) or on the values (the CRC-32 turned on)."""
    if (
        type(tensor) is not torch.Tensor
        or tensor.layout != torch.strided
        or tensor.device.type != "cpu"
        or tensor.is_quantized
        or (hasattr(tensor, "has_names") and tensor.has_names())  # named tensors (older torch)
        or tensor.__dict__
        or torch.utils.serialization.config.save.compute_crc32
    ):
        return None
    nbytes = tensor.untyped_storage().nbytes()
    if nbytes == 0 or tensor.storage_offset() != 0 or nbytes != tensor.nbytes:
        return None  # DCP hands the writer tensors that own their storage; others: torch.save
    return (
        torch.__version__,
        tensor.dtype,
        tuple(tensor.shape),
        tensor.stride(),
        nbytes,
        tensor.requires_grad,
        tensor.is_conj(),
        tensor.is_neg(),
    )


class _Tee(io.RawIOBase):
    """Passes `torch.save`'s writes on to `out`, keeping every write except the storage's
    bytes (recognised by address and size), to learn the archive's frame."""

    def __init__(self, out: Any, data_ptr: int, nbytes: int):
        self._out = out
        self._data = (data_ptr, nbytes)
        self.before: list[bytes] = []
        self.after: list[bytes] = []
        self.data_writes = 0
        self.unknown = False  # a large write that is not the storage's bytes (none kept)

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b)
        written = self._out.write(view)
        if view.nbytes == self._data[1] and self._address(view) == self._data[0]:
            self.data_writes += 1
        elif view.nbytes > _MAX_FRAME_WRITE:  # e.g. the bytes in pieces: not copied
            self.unknown = True
        else:
            (self.after if self.data_writes else self.before).append(view.tobytes())
        return written if written is not None else view.nbytes

    @staticmethod
    def _address(view: memoryview) -> int:
        return np.frombuffer(view, dtype=np.uint8).ctypes.data if view.nbytes else -1


class FrameCache:
    """`torch.save` archives of tensors, written from frames learnt per layout."""

    def __init__(self, max_layouts: int = MAX_LAYOUTS):
        self.max_layouts = max_layouts
        self._frames: dict[Layout, tuple[bytes, bytes] | None] = {}

    def __len__(self) -> int:
        return len(self._frames)

    def save(self, tensor: torch.Tensor, stream: Any) -> None:
        """Write `tensor` to `stream` exactly as `torch.save(tensor, stream)` would."""
        layout = layout_of(tensor)
        if layout is None:
            torch.save(tensor, stream)
            return
        frame = self._frames.get(layout)
        if frame is not None:
            prefix, suffix = frame
            stream.write(prefix)
            stream.write(as_bytes(tensor.untyped_storage()).numpy())
            stream.write(suffix)
            return
        if layout in self._frames or len(self._frames) >= self.max_layouts:
            torch.save(tensor, stream)  # no frame found for this layout, or the cache is full
            return
        storage = tensor.untyped_storage()
        tee = _Tee(stream, storage.data_ptr(), storage.nbytes())
        torch.save(tensor, tee)
        found = tee.data_writes == 1 and not tee.unknown
        learnt = (b"".join(tee.before), b"".join(tee.after)) if found else None
        self._frames.setdefault(layout, learnt)  # atomic: two writers learn the same frame


FRAMES = FrameCache()  # frames depend only on the layout and torch: one cache per process
