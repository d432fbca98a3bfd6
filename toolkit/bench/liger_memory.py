"""`python -m toolkit.bench.liger_memory [--size bench|test] [--dtype bfloat16|float32] [--reps R]`

What Liger's kernels (toolkit.kernels.liger) save in memory against their baseline, the
PyTorch reference beside each kernel (BENCH_CASES: linear then float32 cross-entropy;
F.layer_norm), on the same inputs:

* saved_bytes: what the forward keeps for backward (distinct storages, through autograd's
  saved-tensor hooks): the reference's logits and their float32 copy, against the fused
  kernel's gradients of hidden and weight.
* largest_bytes: the largest tensor any op creates in the forward (a dispatch mode sees
  every allocation; Triton writes into tensors allocated that way): whether the logits
  [tokens, vocab] are ever built whole.
* on CUDA also peak_bytes (torch.cuda.max_memory_allocated above the inputs, forward +
  backward) and the median forward+backward time over R interleaved repetitions (A B, B A,
  ...). On CPU the kernels run in Triton's interpreter (numpy): no time is reported.

Counts are exact and do not depend on the machine's load; times do (report the load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():  # before liger imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

from toolkit.kernels import liger  # noqa: E402
from toolkit.kernels.cases import KernelCase  # noqa: E402


class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor that any op returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest_bytes = max(self.largest_bytes, t.numel() * t.element_size())
        return out


def fresh(inputs: tuple) -> tuple:
    return tuple(
        t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
        for t in inputs
    )


def measure(fn, inputs: tuple) -> dict[str, int]:
    """saved_bytes and largest_bytes of one forward of `fn` on `inputs`, then backward."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    mode = LargestAllocation()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode:
        out = fn(*inputs)
    out.float().sum().backward()
    input_ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    saved = sum(n for ptr, n in storages.items() if ptr not in input_ptrs)
    return {"saved_bytes": saved, "largest_bytes": mode.largest_bytes}


def cuda_peak_and_time(fn, inputs: tuple) -> tuple[int, float]:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fn(*inputs).float().sum().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, time.perf_counter() - start


def run_case(case: KernelCase, size: str, dtype: torch.dtype, reps: int) -> dict[str, dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    inputs = case.make_inputs(size, dtype, device)
    paths = {"reference": case.reference, "liger": case.kernel}
    result = {name: measure(fn, fresh(inputs)) for name, fn in paths.items()}
    if device.type == "cuda":
        for fn in paths.values():  # warm-up: Triton compiles, cuBLAS picks its kernels
            fn(*fresh(inputs)).float().sum().backward()
        times: dict[str, list[float]] = {name: [] for name in paths}
        peaks: dict[str, int] = {}
        for rep in range(reps):
            order = list(paths) if rep % 2 == 0 else list(reversed(paths))
            for name in order:
                peaks[name], seconds = cuda_peak_and_time(paths[name], fresh(inputs))
                times[name].append(seconds)
        for name in paths:
            result[name]["peak_bytes"] = peaks[name]
            result[name]["median_s"] = statistics.median(times[name])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.liger_memory")
    parser.add_argument("--size", choices=["bench", "test"], default="bench")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    mib = 2**20
    print(f"device={'cuda' if torch.cuda.is_available() else 'cpu'} dtype={args.dtype}")
    for case in liger.BENCH_CASES:
        result = run_case(case, args.size, dtype, args.reps)
        print(f"{case.name} ({case.shape if args.size == 'bench' else 'test size'})")
        for name, r in result.items():
            line = (
                f"  {name:9s} saved for backward {r['saved_bytes'] / mib:9.1f} MiB"
                f"  largest tensor {r['largest_bytes'] / mib:9.1f} MiB"
            )
            if "median_s" in r:
                line += (
                    f"  peak {r['peak_bytes'] / mib:9.1f} MiB  median {r['median_s'] * 1e3:.2f} ms"
                )
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
