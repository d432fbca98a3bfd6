"""What a rank sets up so that a step costs little beyond its arithmetic: TF32 for fp32
matmuls (precision.tf32) and CUDA graphs for the compiled blocks (parallel.cuda_graphs).
Each setting is resolved for the device here, once, and said in one line of the run's first
lines (rank 0's log): what is on and why. On a CPU nothing changes.

CUDA graphs come from torch.compile's "reduce-overhead" mode over each block that
parallel.compile compiles (toolkit.distributed.fsdp.parallelize), not from an explicit
capture of the whole step: the training loop's step is not shape-static end to end (the
non-finite guard, gradient clipping and the metrics read values back on the host) and FSDP2
runs its hooks between the blocks. torch's CUDA graph trees replay each block's kernels
and fall back to eager where a graph cannot be kept. `auto` leaves them off until the GPU
check (scripts/gpu_check.sh, step "overhead") has measured them with FSDP2: FSDP2 frees
and re-allocates a block's gathered parameters every step, which a CUDA graph may have to
re-record. The whole-step capture of a plain module (forward, backward and a capturable
optimizer in one graph) is toolkit.bench.quant_step's, where a benchmark owns its step."""

from __future__ import annotations

import torch

from toolkit.config.errors import switch
from toolkit.config.parallel import ParallelConfig
from toolkit.config.precision import PrecisionConfig

AMPERE = (8, 0)  # compute capability from which tensor cores run TF32


def tf32_capable(device: torch.device) -> bool:
    """Whether `device` is a CUDA GPU of the Ampere generation or newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= AMPERE


def set_matmul_precision(cfg: PrecisionConfig, device: torch.device) -> str:
    """Set TF32 for fp32 matmuls and convolutions as `cfg.tf32` asks, where the device has
    it; the run's line saying what is on and why."""
    if not tf32_capable(device):
        where = "a CPU" if device.type != "cuda" else "a GPU older than Ampere"
        return f"tf32: off ({where}: fp32 matmuls run in full fp32)"
    torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    if cfg.tf32:
        return (
            "tf32: on (fp32 matmuls on tensor cores, 10-bit mantissa; "
            "precision.tf32=false keeps them in full fp32)"
        )
    return "tf32: off (precision.tf32=false)"


def cuda_graphs(par: ParallelConfig, device_type: str) -> tuple[bool, str]:
    """Whether the compiled blocks run as CUDA graphs (torch.compile mode "reduce-overhead")
    on `device_type`, and the run's line saying why."""
    asked = switch(par.cuda_graphs)
    if asked == "off":
        return False, "cuda_graphs: off (parallel.cuda_graphs=off)"
    if device_type != "cuda":
        if asked == "on":
            return False, f"cuda_graphs: off (parallel.cuda_graphs=on is ignored on {device_type})"
        return (
            False,
            f"cuda_graphs: off (auto: CUDA graphs need a CUDA device, this is {device_type})",
        )
    if not par.compile:
        return False, "cuda_graphs: off (auto: they come with parallel.compile=true)"
    if asked == "on":
        return True, "cuda_graphs: on (each compiled block in torch.compile's reduce-overhead mode)"
    return False, (
        "cuda_graphs: off (auto: not yet measured with FSDP2 on a GPU; "
        "parallel.cuda_graphs=on compiles each block in reduce-overhead mode)"
    )


def compile_mode(par: ParallelConfig, device_type: str) -> str | None:
    """torch.compile's mode for the blocks: "reduce-overhead" with CUDA graphs, else the
    default (None)."""
    return "reduce-overhead" if cuda_graphs(par, device_type)[0] else None


def apply_step_settings(
    precision: PrecisionConfig, par: ParallelConfig, device: torch.device
) -> list[str]:
    """Set what the process needs (TF32) and return the run's lines for TF32 and CUDA
    graphs (the optimizer's kernels are said where it is built: toolkit.train.optim)."""
    return [set_matmul_precision(precision, device), cuda_graphs(par, device.type)[1]]
