"""The reference the collective benchmark is checked against: the timing loop anyone would
write by hand with torch.distributed, and the busbw formulas written out inline (not shared
with busbw.py).

    python -m toolkit.bench.collectives_baseline [OVERRIDE ...]
        == python -m toolkit.bench.collectives collectives.compare_baseline=true [OVERRIDE ...]

runs both in the same job, interleaved size by size (collectives.baseline_repeats times each,
alternating which goes first), and adds "base time", "base busbw" and their ratio to the table.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from toolkit.collectives.busbw import Layout

# Newer PyTorch names the tensor variants *_single; older versions only have *_tensor.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def minimal_loop(
    op: str, lay: Layout, dtype: torch.dtype, device: torch.device, warmup: int
) -> Callable[[int], float]:
    """Allocate zero buffers, warm up, and return `time(iters)`: seconds per call, averaged
    over ranks, of a bare loop of `iters` calls."""
    n = dist.get_world_size()
    x = torch.zeros(lay.count, dtype=dtype, device=device)
    if op == "all_reduce":

        def call():
            dist.all_reduce(x)
    elif op == "all_gather":
        x = torch.zeros(lay.count // n, dtype=dtype, device=device)
        y = torch.zeros(lay.count, dtype=dtype, device=device)

        def call():
            ALL_GATHER(y, x)
    elif op == "reduce_scatter":
        y = torch.zeros(lay.count // n, dtype=dtype, device=device)

        def call():
            REDUCE_SCATTER(y, x)
    elif op == "all_to_all":
        y = torch.zeros(lay.count, dtype=dtype, device=device)

        def call():
            dist.all_to_all_single(y, x)
    else:

        def call():
            dist.broadcast(x, src=0)

    for _ in range(warmup):
        call()

    def time_iters(iters: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = torch.tensor(
            [(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device
        )
        dist.all_reduce(elapsed)
        return elapsed.item() / n

    return time_iters


def minimal_busbw_gbps(op: str, size_bytes: int, seconds: float, n: int) -> float:
    """nccl-tests' formulas, spelled out independently of toolkit.collectives.busbw."""
    algbw = size_bytes / seconds / 1e9
    if op == "all_reduce":
        return algbw * 2 * (n - 1) / n
    if op == "broadcast":
        return algbw
    return algbw * (n - 1) / n
