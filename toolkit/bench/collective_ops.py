"""One collective at one size: its buffers, the call, and the check of its result.

Inputs follow a pattern every rank can predict for every other rank (x_r[i] = i % 8 + r, and
all_to_all chunks tagged with their destination), so the expected result has a closed form
and no rank ever needs another rank's data to verify its own output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from toolkit.bench.busbw import Layout

# PyTorch 2.13 renamed the tensor variants (*_single); older versions only have *_tensor.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

PATTERN = 8
REDOPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}
# Relative tolerance of reductions (summation order differs between algorithms).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}


@dataclass
class Case:
    run: Callable[[], None]  # one call of the collective
    wrong: Callable[[], int]  # after run() on fresh inputs: number of wrong output elements
    refill: Callable[[], None]  # restore the inputs (all_reduce works in place)
    prepare_timing: Callable[[], None]  # inputs that stay finite under repeated calls


def _base(n_elements: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n_elements, device=device, dtype=torch.float64) % PATTERN


def _reduced(base: torch.Tensor, redop: str, n: int) -> torch.Tensor:
    """Closed form of reducing base + r over ranks r = 0..n-1 (prod uses another pattern)."""
    if redop == "sum":
        return n * base + n * (n - 1) / 2
    if redop == "avg":
        return base + (n - 1) / 2
    if redop == "min":
        return base
    if redop == "max":
        return base + (n - 1)
    raise ValueError(redop)


def _prod_input(n_elements: int, rank: int, n: int, device: torch.device) -> torch.Tensor:
    """prod: 2 where i % n == rank, else 1; the product is 2 everywhere."""
    idx = torch.arange(n_elements, device=device)
    return torch.where(idx % n == rank, 2.0, 1.0).to(torch.float64)


def _count_wrong(out: torch.Tensor, expected: torch.Tensor, exact: bool) -> int:
    got = out.to(torch.float64)
    want = expected.to(out.dtype).to(torch.float64)  # the same rounding as the inputs
    if exact or not out.dtype.is_floating_point:
        return int((got != want).sum().item())
    tol = RTOL.get(out.dtype, 1e-5)
    return int((~torch.isclose(got, want, rtol=tol, atol=tol)).sum().item())


def build_case(
    op: str,
    lay: Layout,
    dtype: torch.dtype,
    device: torch.device,
    rank: int,
    n: int,
    redop: str = "sum",
    root: int = 0,
) -> Case:
    """Allocate the buffers of `op` at layout `lay` and return how to run and check it."""
    red = REDOPS[redop]
    chunk, count = lay.chunk, lay.count

    def reduction_input(size: int) -> torch.Tensor:
        if redop == "prod":
            return _prod_input(size, rank, n, device)
        return _base(size, device) + rank

    def reduction_expected(size: int) -> torch.Tensor:
        if redop == "prod":
            return torch.full((size,), 2.0, dtype=torch.float64, device=device)
        return _reduced(_base(size, device), redop, n)

    if op == "all_reduce":
        buf = torch.empty(count, dtype=dtype, device=device)

        def refill() -> None:
            buf.copy_(reduction_input(count))

        return Case(
            run=lambda: dist.all_reduce(buf, op=red),
            wrong=lambda: _count_wrong(buf, reduction_expected(count), exact=False),
            refill=refill,
            prepare_timing=lambda: buf.zero_(),
        )
    if op == "reduce_scatter":
        src = torch.empty(count, dtype=dtype, device=device)
        out = torch.empty(chunk, dtype=dtype, device=device)

        def refill() -> None:
            src.copy_(reduction_input(count))

        return Case(
            run=lambda: REDUCE_SCATTER(out, src, op=red),
            wrong=lambda: _count_wrong(
                out, reduction_expected(count)[rank * chunk : (rank + 1) * chunk], exact=False
            ),
            refill=refill,
            prepare_timing=lambda: None,
        )
    if op == "all_gather":
        src = torch.empty(chunk, dtype=dtype, device=device)
        out = torch.empty(count, dtype=dtype, device=device)

        def refill() -> None:
            src.copy_(_base(chunk, device) + rank)
            out.fill_(-1)

        def expected() -> torch.Tensor:
            ranks = torch.arange(n, device=device, dtype=torch.float64).repeat_interleave(chunk)
            return _base(chunk, device).repeat(n) + ranks

        return Case(
            run=lambda: ALL_GATHER(out, src),
            wrong=lambda: _count_wrong(out, expected(), exact=True),
            refill=refill,
            prepare_timing=lambda: None,
        )
    if op == "all_to_all":
        per_peer = count // n
        src = torch.empty(per_peer * n, dtype=dtype, device=device)
        out = torch.empty(per_peer * n, dtype=dtype, device=device)

        def refill() -> None:
            # chunk j goes to rank j: value = pattern + sender + PATTERN * receiver
            dest = torch.arange(n, device=device, dtype=torch.float64).repeat_interleave(per_peer)
            src.copy_(_base(per_peer, device).repeat(n) + rank + PATTERN * dest)
            out.fill_(-1)

        def expected() -> torch.Tensor:
            sender = torch.arange(n, device=device, dtype=torch.float64).repeat_interleave(per_peer)
            return _base(per_peer, device).repeat(n) + sender + PATTERN * rank

        return Case(
            run=lambda: dist.all_to_all_single(out, src),
            wrong=lambda: _count_wrong(out, expected(), exact=True),
            refill=refill,
            prepare_timing=lambda: None,
        )
    if op == "broadcast":
        buf = torch.empty(count, dtype=dtype, device=device)

        def refill() -> None:
            if rank == root:
                buf.copy_(_base(count, device) + root)
            else:
                buf.fill_(-1)

        return Case(
            run=lambda: dist.broadcast(buf, src=root),
            wrong=lambda: _count_wrong(buf, _base(count, device) + root, exact=True),
            refill=refill,
            prepare_timing=lambda: None,
        )
    raise ValueError(f"op={op}: unknown collective")
