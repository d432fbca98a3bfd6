"""The launcher's check of `model.kernels` (a runtime check: toolkit.config does not know
which libraries are installed or where the ranks run). `model.kernels=liger` that cannot run
fails here, in one line, before any rank starts; toolkit.kernels.liger.resolve says the same
on the rank, for jobs built by hand.

Imports no torch (the launcher stays light) unless the job asks for liger."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from toolkit.config.parallel import mesh_shape
from toolkit.config.shape import local_gpu_count

TP_REASON = (
    "tensor parallelism shards the head over the vocabulary (Liger's fused cross-entropy "
    "needs the whole head) and runs the norms on sequence-sharded DTensors"
)


def liger_problem(installed: bool, triton_runs: bool, tp: int) -> str | None:
    """Why model.kernels=liger cannot run here, in one line; None when it can."""
    if tp > 1:
        return (
            f"model.kernels=liger with parallel.tp={tp}: {TP_REASON}; use model.kernels=auto "
            "(torch under tp) or model.kernels=torch"
        )
    if not installed:
        return (
            "model.kernels=liger: liger-kernel (or triton) is not installed; install the "
            "kernels extra (pip install -e '.[kernels]') or use model.kernels=auto"
        )
    if not triton_runs:
        return (
            "model.kernels=liger: the ranks run on CPU, where Triton runs only under "
            "TRITON_INTERPRET=1 (slow, for tests); run on GPUs or use model.kernels=auto"
        )
    return None


def kernel_problems(job: Any, world: int) -> list[str]:
    """model.kernels=liger where it cannot run: not installed, CPU ranks without
    TRITON_INTERPRET=1, or tensor parallelism."""
    if getattr(job.model, "kernels", "torch") != "liger":  # the built-in transformers only
        return []
    shape = mesh_shape(job.parallel, world)
    tp = 1 if isinstance(shape, str) else shape.tp  # a bad layout is parallel's to report
    installed = all(importlib.util.find_spec(p) is not None for p in ("liger_kernel", "triton"))
    problem = liger_problem(installed, _ranks_on_gpu(job.cluster) or _interpreted(), tp)
    return [problem] if problem else []


def _ranks_on_gpu(cluster: Any) -> bool:
    """Slurm ranks get cluster.gpus_per_node; local ranks the GPUs of this machine."""
    if cluster.kind == "slurm":
        return cluster.gpus_per_node > 0
    return local_gpu_count() > 0


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"  # the ranks inherit it
