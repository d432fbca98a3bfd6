"""A rank out of memory says so in one line: what it tried to allocate, the memory it has
(the device's, or on CPU this host's available memory shared by its ranks) and the settings
that lower the peak; no traceback (toolkit.entrypoint)."""

from __future__ import annotations

import re
import sys
from typing import Any

# What torch's allocators say when an allocation fails (CPU: DefaultCPUAllocator; CUDA:
# torch.OutOfMemoryError), also when relayed from a DataLoader worker.
MARKERS = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough")
MARKERS += ("CUDA out of memory", "out of memory")
TRIED = re.compile(r"(?:tried to allocate|Tried to allocate)\s+([\d.,]+\s*(?:bytes|[KMGTP]i?B))")
GIB = 2**30


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in MARKERS)


def _size(text: str) -> str:
    """'68719476736 bytes' -> '64.00 GiB'; torch's own unit otherwise."""
    number, _, unit = text.replace(",", "").partition(" ")
    if unit.strip() == "bytes":
        return f"{float(number) / GIB:,.2f} GiB"
    return text


def out_of_memory_line(exc: BaseException, job: Any, rank: int, local_ranks: int) -> str:
    """One line: rank, what it tried to allocate, its memory, the settings to lower."""
    from toolkit.distributed.host_memory import host_bytes_per_rank

    tried = TRIED.search(str(exc))
    what = f"tried to allocate {_size(tried.group(1))}" if tried else type(exc).__name__
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        memory = f"device memory {total / GIB:,.2f} GiB, {free / GIB:,.2f} GiB free now"
    else:
        per_rank = host_bytes_per_rank(local_ranks)
        memory = (
            "host memory"
            if per_rank is None
            else f"host memory: {per_rank * local_ranks / GIB:,.2f} GiB available now for "
            f"{local_ranks} rank(s)"
        )
    t = job.trainer
    batch = (
        f"trainer.micro_batch_size={t.micro_batch_size}"
        if t.global_batch_size is None
        else f"trainer.global_batch_size={t.global_batch_size}"
    )
    return (
        f"rank {rank} ran out of memory ({what}; {memory}): lower {batch} or data.seq_len, "
        "raise trainer.grad_accum, or set parallel.activation_checkpointing=true"
    )
