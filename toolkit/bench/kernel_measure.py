"""Measure one forward + backward call of a function: time, peak memory, bytes saved for
backward (what `python -m toolkit.bench.kernels` reports for each variant of a KernelCase).

* Saved bytes: torch.autograd.graph.saved_tensors_hooks sees every tensor autograd keeps for
  backward, on any device (the meta device too: sizes only) and through torch.compile's
  graphs; the unique storages are summed, the inputs' own storages left out (they are alive
  anyway). Exact.
* Largest bytes: the largest tensor any op returns in the forward (a dispatch mode sees every
  allocation; Triton writes into tensors allocated that way): whether, say, the logits
  [tokens, vocab] are ever built whole.
* Peak bytes: on CUDA, torch.cuda.max_memory_allocated above what was allocated before the
  call. On CPU, torch.profiler(profile_memory=True) records every allocation and free of
  torch's CPU allocator; the peak is the running sum's maximum from the start of the call.
  It counts the tensors torch allocates (outputs, saved tensors, temporaries, gradients); it
  does not see memory outside torch's allocator (e.g. the numpy buffers of Triton's
  interpreter under TRITON_INTERPRET=1).
* Time: wall clock of one call (synchronised on CUDA); the caller interleaves variants and
  takes medians.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def tensors_of(inputs: Sequence[Any]) -> list[torch.Tensor]:
    return [t for t in inputs if isinstance(t, torch.Tensor)]


def call(fn: Callable[..., torch.Tensor], inputs: Sequence[Any], backward: bool) -> torch.Tensor:
    """One forward (+ backward of out.float().sum()) with the inputs' gradients cleared
    first, so every call allocates the same."""
    for t in tensors_of(inputs):
        t.grad = None
    out = fn(*inputs)
    if backward:
        out.float().sum().backward()
    return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def saved_bytes(fn: Callable[..., torch.Tensor], inputs: Sequence[Any]) -> int:
    """Bytes of the unique storages autograd saves for backward in one forward, the inputs'
    storages excluded."""
    # A storage's identity (not its data pointer: on the meta device every pointer is 0).
    own = {t.untyped_storage()._cdata for t in tensors_of(inputs)}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in own:
            seen[storage._cdata] = storage.nbytes()
        return t

    for t in tensors_of(inputs):
        t.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    del out
    return sum(seen.values())


def largest_bytes(fn: Callable[..., torch.Tensor], inputs: Sequence[Any]) -> int:
    """Bytes of the largest tensor any op returns during one forward of fn(*inputs)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel() * t.element_size())
            return out

    with Largest() as mode:
        fn(*inputs)
    return mode.largest


def cpu_peak_bytes(run: Callable[[], Any]) -> int:
    """Peak of torch's CPU allocator over `run`, above its level at the start (profiler
    allocation events, running sum)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    sizes.sort()
    return max(itertools.accumulate((s for _, s in sizes), initial=0))


def peak_bytes(
    fn: Callable[..., torch.Tensor], inputs: Sequence[Any], backward: bool, device: torch.device
) -> int:
    """Peak bytes allocated during one forward + backward, above the level before it (the
    inputs' old gradients are freed before, not during, the measured call)."""
    for t in tensors_of(inputs):
        t.grad = None
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        call(fn, inputs, backward)
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    return cpu_peak_bytes(lambda: call(fn, inputs, backward))


def timed_call(
    fn: Callable[..., torch.Tensor], inputs: Sequence[Any], backward: bool, device: torch.device
) -> float:
    synchronize(device)
    start = time.perf_counter()
    call(fn, inputs, backward)
    synchronize(device)
    return time.perf_counter() - start


def interleaved_times(
    fns: dict[str, Callable[..., torch.Tensor]],
    inputs: Sequence[Any],
    backward: bool,
    device: torch.device,
    reps: int,
    warmup: int = 2,
) -> dict[str, list[float]]:
    """Seconds per call of each function, interleaved (A B C A B C ...) so that drifts of a
    shared machine fall on every variant alike."""
    for _ in range(warmup):
        for fn in fns.values():
            call(fn, inputs, backward)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(timed_call(fn, inputs, backward, device))
    return times


def max_abs_difference(
    fn: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor], inputs: Sequence[Any]
) -> float:
    """Largest |fn - reference| of the forward outputs (no gradient)."""
    with torch.no_grad():
        return float((fn(*inputs).float() - reference(*inputs).float()).abs().max())
