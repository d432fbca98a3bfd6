"""What the time-series kernels save: bytes kept for the backward (exact, on the meta device,
so any size costs nothing) and forward+backward time, reference eager (the baseline) vs the
reference under torch.compile vs the fused op where Triton runs natively (a GPU).

    python -m toolkit.bench.ts_kernels [--size bench|test] [--repeats 5] [--device cpu]

Times are interleaved (one round runs every variant once) and reported as medians, because
a shared machine drifts between runs. Under TRITON_INTERPRET=1 the fused op is not timed:
the interpreter measures Python, not the kernel. toolkit.bench.kernels (BENCH_CASES of every
kernel module) is the general benchmark; this one adds the saved-for-backward accounting."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from toolkit.kernels import masked_loss, masked_norm
from toolkit.kernels.backend import interpret_mode, triton_runs_on
from toolkit.kernels.cases import KernelCase

CASES: tuple[KernelCase, ...] = (*masked_norm.BENCH_CASES, *masked_loss.BENCH_CASES)
# The fused entry points (custom ops, without the device dispatch) for the meta device.
FUSED_ON_META: dict[str, Callable[..., torch.Tensor]] = {
    "masked_cross_section_norm": lambda x, mask: masked_norm._fwd_op(x, mask, 1e-5)[0],
    "masked_mse_loss": lambda p, t, w: masked_loss._fwd_op(p, t, w, "mse", 1.0),
    "masked_huber_loss": lambda p, t, w: masked_loss._fwd_op(p, t, w, "huber", 1.0),
}


def saved_bytes(fn: Callable[..., torch.Tensor], args: tuple) -> int:
    """Bytes autograd keeps for the backward of fn(*args), storages counted once and the
    arguments' own storages not at all (the caller holds those anyway)."""
    given = {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in given:
            kept[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(kept.values())


def fwd_bwd_s(fn: Callable[..., torch.Tensor], args: tuple, device: torch.device) -> float:
    for a in args:
        if isinstance(a, torch.Tensor):
            a.grad = None
    start = time.perf_counter()
    fn(*args).float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def timings(case: KernelCase, size: str, device: torch.device, repeats: int) -> dict[str, float]:
    """Median forward+backward seconds of each variant, rounds interleaved, one warm-up."""
    args = case.make_inputs(size, torch.float32, device)
    variants = {"reference": case.reference, "compiled": torch.compile(case.reference)}
    if triton_runs_on(device) and not interpret_mode():
        variants["fused"] = case.kernel
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats + 1):
        for name, fn in variants.items():
            seconds = fwd_bwd_s(fn, args, device)
            if r:
                runs[name].append(seconds)
    return {name: statistics.median(v) for name, v in runs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.ts_kernels")
    parser.add_argument("--size", choices=("test", "bench"), default="bench")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: must be >= 1")
    device = torch.device(args.device)
    meta = torch.device("meta")
    print(f"size={args.size} device={device} load={os.getloadavg()[0]:.2f}")
    for case in CASES:
        inputs = case.make_inputs(args.size, torch.float32, meta)
        ref_mib = saved_bytes(case.reference, inputs) / 2**20
        fused_mib = saved_bytes(FUSED_ON_META[case.name], inputs) / 2**20
        times = timings(case, args.size, device, args.repeats)
        shown = "  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items())
        print(
            f"{case.name}: saved for backward: reference {ref_mib:.3f} MiB, fused "
            f"{fused_mib:.3f} MiB; fwd+bwd median of {args.repeats}: {shown}"
        )


if __name__ == "__main__":
    main()
