"""Where a Triton kernel can run: on a CUDA device, or on the CPU under Triton's interpreter
(TRITON_INTERPRET=1, read by Triton when a kernel module is imported: set it before the
first import of triton or of a library built on it)."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


def interpret_mode() -> bool:
    """True when Triton kernels run on the CPU through Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def importable(package: str) -> bool:
    """True when `package` can be imported (without importing it)."""
    return importlib.util.find_spec(package) is not None


def triton_runs_on(device: torch.device | str) -> bool:
    """True when a Triton kernel can run on tensors of `device`."""
    kind = torch.device(device).type
    if not importable("triton"):
        return False
    return kind == "cuda" or (kind == "cpu" and interpret_mode())
