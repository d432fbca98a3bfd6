"""Collective benchmark arithmetic, as nccl-tests defines it (doc/PERFORMANCE.md there).

* size: the bytes nccl-tests reports per op: the buffer for all_reduce and broadcast, the
  gathered output for all_gather, the (unscattered) input for reduce_scatter, one rank's whole
  send buffer for all_to_all. Per-rank chunks are rounded down to a multiple of 4 elements.
* algbw = size / time, in GB/s with GB = 1e9 bytes.
* busbw = algbw * factor: 2(n-1)/n all_reduce; (n-1)/n all_gather, reduce_scatter,
  all_to_all; 1 broadcast. It is comparable across ops and rank counts, against link speed.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN_ELEMENTS = 4  # per-rank chunk granularity (nccl-tests' ALIGN)
CHUNKED_OPS = ("all_gather", "reduce_scatter", "all_to_all")


def bus_factor(op: str, num_ranks: int) -> float:
    n = num_ranks
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in CHUNKED_OPS:
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(
        f"op={op}: unknown collective; allowed: all_reduce, broadcast, {', '.join(CHUNKED_OPS)}"
    )


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    return size_bytes / 1e9 / time_s if time_s > 0 else 0.0


def busbw_gbps(op: str, size_bytes: int, time_s: float, num_ranks: int) -> float:
    return algbw_gbps(size_bytes, time_s) * bus_factor(op, num_ranks)


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*f, min*f^2, ... <= max (nccl-tests -b/-e/-f)."""
    if min_bytes < 1 or factor < 2 or max_bytes < min_bytes:
        return [min_bytes] if 1 <= min_bytes <= max_bytes else []
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


@dataclass(frozen=True)
class Layout:
    """Element counts of one op at one nominal size."""

    op: str
    size_bytes: int  # as reported
    count: int  # size_bytes / itemsize
    chunk: int  # per-rank chunk (elements): the input of all_gather, output of reduce_scatter


def layout(op: str, nominal_bytes: int, itemsize: int, num_ranks: int) -> Layout | None:
    """The buffers for a nominal sweep size; None when the size is too small for this op."""
    count = nominal_bytes // itemsize
    if op in CHUNKED_OPS:
        chunk = (count // (ALIGN_ELEMENTS * num_ranks)) * ALIGN_ELEMENTS
        count = chunk * num_ranks
    else:
        chunk = count
    if count == 0:
        return None
    return Layout(op=op, size_bytes=count * itemsize, count=count, chunk=chunk)


def buffer_bytes(op: str, size_bytes: int) -> int:
    """Peak bytes one rank allocates for one size: send + receive (at most 2 x size for
    all_to_all), plus the baseline loop's own pair and the checks' small float64 slices."""
    return 4 * size_bytes


def average(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
