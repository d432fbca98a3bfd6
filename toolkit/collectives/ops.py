"""One collective at one size: its buffers, the call, and the check of its result.

Inputs follow a pattern every rank can predict for every other rank (x_r[i] = i % 8 + r, and
all_to_all chunks tagged with sender and receiver), so each expected output element has a
closed form in its index and no rank needs another rank's data to verify its own output.
Inputs are written and outputs checked in slices of CHUNK elements, so the float64
temporaries stay small next to 1 GiB buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from toolkit.collectives.busbw import Layout

# Newer PyTorch names the tensor variants *_single; older versions only have *_tensor.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

PATTERN = 8
CHUNK = 1 << 22
REDOPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}
# Relative tolerance of reductions (summation order differs between algorithms).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}

Values = Callable[[torch.Tensor], torch.Tensor]  # int64 element indices -> float64 values


@dataclass
class Case:
    run: Callable[[], None]  # one call of the collective
    wrong: Callable[[], int]  # after refill() and run(): number of wrong output elements
    refill: Callable[[], None]  # write the patterned inputs (all_reduce works in place)
    prepare_timing: Callable[[], None]  # inputs that stay finite under repeated calls
    output: torch.Tensor  # where the result lands (what wrong() inspects)


def fill(t: torch.Tensor, values: Values) -> None:
    for start in range(0, t.numel(), CHUNK):
        stop = min(start + CHUNK, t.numel())
        t[start:stop] = values(torch.arange(start, stop, device=t.device)).to(t.dtype)


def count_wrong(out: torch.Tensor, values: Values, exact: bool) -> int:
    """Elements of `out` that differ from the expected values (in out's dtype rounding)."""
    wrong = 0
    tol = RTOL.get(out.dtype, 0.0)
    for start in range(0, out.numel(), CHUNK):
        stop = min(start + CHUNK, out.numel())
        want = values(torch.arange(start, stop, device=out.device)).to(out.dtype)
        got = out[start:stop]
        if exact or not out.dtype.is_floating_point:
            wrong += int((got != want).sum().item())
        else:
            close = torch.isclose(got.double(), want.double(), rtol=tol, atol=tol)
            wrong += int((~close).sum().item())
    return wrong


def base(idx: torch.Tensor) -> torch.Tensor:
    return (idx % PATTERN).double()


def reduction_values(redop: str, rank: int, n: int) -> tuple[Values, Values]:
    """(input of this rank, reduced result) as functions of the element index."""
    if redop == "prod":  # 2 where i % n == rank, else 1: the product is 2 everywhere
        return (
            lambda idx: torch.where(idx % n == rank, 2.0, 1.0).double(),
            lambda idx: torch.full(idx.shape, 2.0, dtype=torch.float64, device=idx.device),
        )
    reduced: dict[str, Values] = {
        "sum": lambda idx: n * base(idx) + n * (n - 1) / 2,
        "avg": lambda idx: base(idx) + (n - 1) / 2,
        "min": base,
        "max": lambda idx: base(idx) + (n - 1),
    }
    return (lambda idx: base(idx) + rank), reduced[redop]


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
    my_input, reduced = reduction_values(redop, rank, n)

    def empty(numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, device=device)

    if op == "all_reduce":
        buf = empty(count)
        return Case(
            run=lambda: dist.all_reduce(buf, op=red),
            wrong=lambda: count_wrong(buf, reduced, exact=False),
            refill=lambda: fill(buf, my_input),
            prepare_timing=buf.zero_,  # repeated in-place sums would overflow
            output=buf,
        )
    if op == "reduce_scatter":
        src, out = empty(count), empty(chunk)
        return Case(
            run=lambda: REDUCE_SCATTER(out, src, op=red),
            wrong=lambda: count_wrong(out, lambda i: reduced(i + rank * chunk), exact=False),
            refill=lambda: fill(src, my_input),
            prepare_timing=lambda: None,
            output=out,
        )
    if op == "all_gather":
        src, out = empty(chunk), empty(count)

        def refill() -> None:
            fill(src, my_input)
            out.fill_(-1)

        return Case(
            run=lambda: ALL_GATHER(out, src),
            # element i came from rank i // chunk, index i % chunk there
            wrong=lambda: count_wrong(out, lambda i: base(i % chunk) + i // chunk, exact=True),
            refill=refill,
            prepare_timing=lambda: None,
            output=out,
        )
    if op == "all_to_all":
        per_peer = count // n
        src, out = empty(per_peer * n), empty(per_peer * n)

        def refill() -> None:
            # chunk j goes to rank j: pattern + sender + PATTERN * receiver
            fill(src, lambda i: base(i % per_peer) + rank + PATTERN * (i // per_peer))
            out.fill_(-1)

        return Case(
            run=lambda: dist.all_to_all_single(out, src),
            wrong=lambda: count_wrong(
                out, lambda i: base(i % per_peer) + i // per_peer + PATTERN * rank, exact=True
            ),
            refill=refill,
            prepare_timing=lambda: None,
            output=out,
        )
    if op == "broadcast":
        buf = empty(count)

        def refill() -> None:
            if rank == root:
                fill(buf, lambda i: base(i) + root)
            else:
                buf.fill_(-1)

        return Case(
            run=lambda: dist.broadcast(buf, src=root),
            wrong=lambda: count_wrong(buf, lambda i: base(i) + root, exact=True),
            refill=refill,
            prepare_timing=lambda: None,
            output=buf,
        )
    raise ValueError(f"op={op}: unknown collective")
