"""Copying the training state into CPU memory for an async save, without holding the GIL.

DCP's DefaultStager copies each tensor's storage with `UntypedStorage.copy_`, which holds the
GIL for the whole copy: while the staging thread copies a 150 MB embedding, the training
thread cannot run a line of Python, and the same copy as a tensor `copy_` far less (see
docs/BENCHMARKS.md, Issue 4). With gpt_125m's model and optimizer state, that is training
lost per checkpoint even with a spare core for the copy. `build_stager` keeps DCP's stager
(its walk over the state dict, DTensor handling, cached buffers reused from one save to the next,
pinned memory on GPU) and copies each storage as a byte tensor instead, which torch does with
the GIL released.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from toolkit.checkpoint import compat


def as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over all of `storage` (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@functools.cache
def _gil_free_stager(base: type) -> type:
    """DCP's StateDictStager (`base`, private to DCP: see toolkit.checkpoint.compat) with its
    one storage copy done as a tensor copy."""

    class GilFreeStorageStager(base):  # type: ignore[misc,valid-type]
        def _stage_untyped_storage(
            self, storage: torch.UntypedStorage, non_blocking: bool = False
        ) -> torch.UntypedStorage:
            cached = self._cached_storage_mapping.get(storage)
            if cached is None or cached.nbytes() != storage.nbytes():
                pin = self.pin_memory and storage.nbytes() >= self.pin_memory_min_bytes
                cached = torch.empty(
                    storage.nbytes(), dtype=torch.uint8, pin_memory=pin
                ).untyped_storage()
                self._cached_storage_mapping[storage] = cached
            as_bytes(cached).copy_(as_bytes(storage), non_blocking=non_blocking)
            return cached

    return GilFreeStorageStager


def build_stager(device: torch.device, overlap: bool, gil_free: bool = True) -> DefaultStager:
    """Copy into CPU memory (pinned, with non-blocking copies on a side stream on GPU), on
    the training thread or, with `overlap`, in a staging thread while the next step's
    forward/backward runs. The stager keeps its CPU buffers and reuses them for the next
    save; that is safe only because a save starts after the previous one finished writing
    (one in flight). `gil_free=False` leaves DCP's own copies (which hold the GIL): the
    baseline of the benchmarks and tests."""
    cuda = device.type == "cuda"
    stager = DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,
            use_async_staging=overlap,
            use_non_blocking_copy=cuda,
        )
    )
    if not gil_free:
        return stager
    base = compat.state_dict_stager()
    inner = compat.stager_parts(stager, base) if base is not None else None
    if base is not None and inner is not None:
        stager._state_dict_stager = _gil_free_stager(base)(pin_memory=inner.pin_memory)
        inner.close()
    return stager
