"""What `python -m toolkit.bench.kernels` measures: each kernel module lists its cases as
`BENCH_CASES`, and the benchmark collects them from `CASE_MODULES`.

A case pairs a fused kernel with its PyTorch reference on the same inputs: the benchmark times
and sizes (peak memory, memory saved for backward) the reference eager, the reference under
torch.compile, and the kernel; the correctness tests compare the two."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Modules that define BENCH_CASES (imported by the benchmark; a module whose library is not
# installed is skipped with a line saying so).
CASE_MODULES = (
    "toolkit.kernels.liger",
    "toolkit.kernels.masked_norm",
    "toolkit.kernels.masked_loss",
)


@dataclass(frozen=True)
class KernelCase:
    name: str  # e.g. "fused_linear_cross_entropy"
    # make_inputs(size, dtype, device) -> positional arguments of `reference` and `kernel`;
    # size is "test" (seconds under TRITON_INTERPRET=1) or "bench" (a model-sized shape).
    # Floating tensors that need a gradient come back with requires_grad=True.
    make_inputs: Callable[[str, torch.dtype, torch.device], tuple]
    reference: Callable[..., torch.Tensor]  # plain PyTorch, the numerics contract
    kernel: Callable[..., torch.Tensor]  # the fused path (Triton; Liger or ours)
    backward: bool = True  # the benchmark also runs out.float().sum().backward()
    shape: str = ""  # the bench size's shape, in words, for the table
    # The fused op's entry on the meta device (shapes only, no device dispatch), for the
    # saved-for-backward bytes at any size (`toolkit.bench.kernels --device meta`).
    meta_kernel: Callable[..., torch.Tensor] | None = None
