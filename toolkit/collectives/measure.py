"""Timing one collective at one size, nccl-tests style, and the run's verdict.

Used by `task=bench_collectives` (toolkit.tasks.bench_collectives; the command is
`python -m toolkit.bench.collectives`).

For every op in collectives.ops and every size of the sweep: warm-up calls (the first one on
patterned inputs, checked), then `iters` timed calls back to back, one device sync at the end;
time per call averaged over ranks (collectives.time_reduce). Rank 0 prints the table and
writes RUN_DIR/collectives.h5 and RUN_DIR/collectives.txt. Wrong results (exit 3) and an
average busbw below collectives.expected_busbw_gbps (exit 4) fail the run, after the report.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from toolkit.collectives.busbw import algbw_gbps, buffer_bytes, busbw_gbps, layout
from toolkit.collectives.ops import build_case
from toolkit.collectives.report import (
    Row,
    op_averages,
)
from toolkit.config.collectives import CollectivesConfig

log = logging.getLogger("toolkit.bench.collectives")

GPU_DEFAULT_MAX = 1 << 30
CPU_DEFAULT_MAX = 16 << 20  # gloo on CPU: the whole default sweep in well under a minute
MEMORY_SHARE = 0.5  # of the free memory, split among the node's ranks
EXIT_WRONG = 3
EXIT_SLOW = 4
REDUCING_OPS = ("all_reduce", "reduce_scatter")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def combine_time(seconds: float, how: str, device: torch.device) -> float:
    """One number for all ranks (nccl-tests -a): avg | max | min | rank0."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    if how == "rank0":
        dist.broadcast(t, src=0)
        return t.item()
    op = {"avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[how]
    dist.all_reduce(t, op=op)
    return t.item() / (dist.get_world_size() if how == "avg" else 1)


def time_calls(call: Callable[[], None], iters: int, device: torch.device) -> float:
    """Seconds per call on this rank: start together, enqueue `iters` calls, sync once."""
    dist.barrier()
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    sync(device)
    return (time.perf_counter() - start) / iters


def memory_cap_bytes(device: torch.device, local_ranks: int) -> int:
    """Largest size whose buffers fit in this rank's share of free memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        share = free * MEMORY_SHARE
    else:
        import psutil

        share = psutil.virtual_memory().available * MEMORY_SHARE / max(1, local_ranks)
    return int(share // buffer_bytes("all_to_all", 1))


def max_bytes(cfg: CollectivesConfig, device: torch.device, local_ranks: int) -> int:
    default = GPU_DEFAULT_MAX if device.type == "cuda" else CPU_DEFAULT_MAX
    wanted = cfg.max_bytes if cfg.max_bytes is not None else default
    cap = memory_cap_bytes(device, local_ranks)
    if wanted > cap:
        log.warning("collectives.max_bytes=%d: capped at %d bytes by free memory", wanted, cap)
    return min(wanted, cap)


def measure(
    cfg: CollectivesConfig, op: str, size: int, device: torch.device, baseline=None
) -> Row | None:
    """One table row: check once, warm up, time; optionally interleave the baseline loop."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, cfg.dtype)
    lay = layout(op, size, dtype.itemsize, n)
    if lay is None:
        return None
    case = build_case(op, lay, dtype, device, rank, n, cfg.redop, cfg.root)
    wrong = 0
    case.refill()  # also without the check: uninitialised memory may hold slow denormals
    if cfg.check:
        case.run()
        sync(device)
        local = torch.tensor([case.wrong()], dtype=torch.int64, device=device)
        dist.all_reduce(local)
        wrong = int(local.item())
    case.prepare_timing()
    for _ in range(cfg.warmup_iters):
        case.run()
    minimal = baseline(op, lay, dtype, device, cfg.warmup_iters) if baseline else None
    times, base_times = [], []
    for i in range(cfg.baseline_repeats if minimal else 1):
        # Alternate who goes first so neither side always runs on a warmer cache/link.
        if minimal and i % 2 == 1:
            base_times.append(minimal(cfg.iters))
        times.append(combine_time(time_calls(case.run, cfg.iters, device), cfg.time_reduce, device))
        if minimal and i % 2 == 0:
            base_times.append(minimal(cfg.iters))
    seconds = statistics.median(times)
    row = Row(
        op=op,
        size_bytes=lay.size_bytes,
        count=lay.count,
        dtype=cfg.dtype,
        redop=cfg.redop if op in REDUCING_OPS else "none",
        root=cfg.root if op == "broadcast" else -1,
        time_us=seconds * 1e6,
        algbw_gbps=algbw_gbps(lay.size_bytes, seconds),
        busbw_gbps=busbw_gbps(op, lay.size_bytes, seconds, n),
        wrong=wrong,
    )
    if base_times:
        from toolkit.collectives.baseline import minimal_busbw_gbps

        base = statistics.median(base_times)
        row.baseline_time_us = base * 1e6
        row.baseline_busbw_gbps = minimal_busbw_gbps(op, lay.size_bytes, base, n)
        # busbw ratio of each adjacent pair (same moment, same load), then the median
        row.paired_ratio = statistics.median(b / t for t, b in zip(times, base_times, strict=True))
    del case
    return row


def verdict(cfg: CollectivesConfig, rows: list[Row]) -> tuple[int, list[str]] | None:
    """(exit code, lines) when the run must fail: wrong results first, then slow links."""
    wrong = [r for r in rows if r.wrong]
    if wrong:
        return EXIT_WRONG, [
            f"{r.op} at {r.size_bytes} B: {r.wrong} wrong elements (over all ranks)" for r in wrong
        ]
    if cfg.expected_busbw_gbps is not None:
        slow = [
            f"{op}: average busbw {avg:.3f} GB/s is below collectives.expected_busbw_gbps="
            f"{cfg.expected_busbw_gbps}"
            for op, avg in op_averages(rows).items()
            if avg < cfg.expected_busbw_gbps
        ]
        if slow:
            return EXIT_SLOW, slow
    return None
