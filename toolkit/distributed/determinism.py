"""trainer.deterministic: two runs with the same seed give bitwise-equal results.

What varies between two runs of the same program with the same seed, and what fixes it:
- kernels that pick an algorithm by timing, or accumulate with atomics (cuDNN's
  benchmark mode, scatter/index_add on CUDA): `torch.use_deterministic_algorithms(True)`
  (an op without a deterministic version then raises, naming itself);
- cuBLAS's split-K reductions across its workspace: CUBLAS_WORKSPACE_CONFIG=:4096:8, read
  when the first cuBLAS handle is made, so set before CUDA starts in this process;
- NCCL's choice of algorithm (ring, tree, NVLS, CollNet) and protocol (LL, LL128, Simple)
  by message size and topology, each summing in another order: NCCL_ALGO=Ring and
  NCCL_PROTO=Simple (NCCL_DETERMINISTIC, layered by toolkit.nccl.env as the
  "deterministic" source: a value of yours in the environment or nccl.env still wins).
DataLoader workers need nothing more: torch seeds each worker (torch, random, numpy) from
a base seed drawn from the global generator, which the trainer seeds with the job's seed
before the loader opens.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

log = logging.getLogger("toolkit.determinism")

CUBLAS_WORKSPACE = ":4096:8"
NCCL_DETERMINISTIC = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def enable_deterministic(is_rank0: bool, environ: MutableMapping[str, str] | None = None) -> str:
    """Turn the mode on in this process (before CUDA and the process group start) and
    return its one line, which rank 0 logs among the run's first lines."""
    import torch  # here: the launcher imports NCCL_DETERMINISTIC without loading torch

    target = os.environ if environ is None else environ
    target.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # yours wins
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    line = (
        "deterministic mode on (trainer.deterministic=true): "
        "torch.use_deterministic_algorithms(True), "
        f"CUBLAS_WORKSPACE_CONFIG={target['CUBLAS_WORKSPACE_CONFIG']}, "
        + ", ".join(f"{k}={v}" for k, v in NCCL_DETERMINISTIC.items())
        + " (unless set in the environment or nccl.env)"
    )
    if is_rank0:
        log.info("%s", line)
    return line
