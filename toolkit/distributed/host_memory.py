"""CPU ranks: let glibc keep freed memory for the next step instead of returning it.

By default glibc serves every allocation above its mmap threshold (at most 32 MiB) with fresh
pages from the kernel and unmaps them on free. A training step allocates and frees the same
large buffers every time (FSDP2's gather and reduce buffers, unsharded gradients, logits), so
each step faults in and zeroes those pages again. On the 2-core dev VM a gpt_125m step on
one rank took 2.24 s that way and 1.33 s with this setting (docs/BENCHMARKS.md). With
mmap off and trimming pushed out, freed blocks stay in the heap and the next step reuses them,
as the CUDA caching allocator does on a GPU; the cost is that the process keeps its peak
footprint.

Applied once per CPU rank (toolkit.distributed.init) and by the hardware profile, through
glibc's public `mallopt`. Left alone where the user set MALLOC_MMAP_MAX_,
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES, and where the C library is
not glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB of free heap top before trimming
USER_SETTINGS = (
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",  # toolkit.measure.run --exact-rss sets it
    "MALLOC_TRIM_THRESHOLD_",
    "GLIBC_TUNABLES",
)


def keep_freed_memory(environ: dict[str, str] | None = None) -> str:
    """Turn glibc's mmap path off and its trimming down; returns what was done, for the log."""
    env = os.environ if environ is None else environ
    user = [name for name in USER_SETTINGS if name in env]
    if user:
        return f"malloc settings left as the environment sets them ({', '.join(user)})"
    if platform.libc_ver()[0] != "glibc":
        return "malloc settings unchanged (not glibc)"
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return "malloc settings unchanged (no mallopt)"
    if mallopt(M_MMAP_MAX, 0) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "malloc settings unchanged (mallopt refused)"
    return "freed memory kept for reuse (glibc: mmap off, trim threshold 2 GiB)"


def host_bytes_per_rank(ranks: int) -> float | None:
    """This host's available memory (/proc/meminfo MemAvailable) shared by `ranks` ranks:
    what each CPU rank has; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / max(1, ranks)
    except (OSError, ValueError, IndexError):
        pass
    return None
