"""Numeric precision, mapped onto FSDP2's MixedPrecisionPolicy.

TF32 for fp32 matmuls (precision.tf32) is set where the rank starts its training
(toolkit.distributed.step_overhead)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrecisionConfig:
    name: str = "fp32"
    param_dtype: str = "float32"  # dtype of all-gathered parameters used in compute
    reduce_dtype: str = "float32"  # dtype of gradient reduce-scatter
    # fp32 matmuls and convolutions on TF32 tensor cores (Ampere and newer GPUs; a 10-bit
    # mantissa, as torch.set_float32_matmul_precision("high")). No effect on a CPU.
    tf32: bool = True

    DTYPES = ("float32", "bfloat16", "float16")


def problems(pr: PrecisionConfig) -> list[str]:
    """Unknown dtypes, one line each."""
    return [
        f"precision.{name}={getattr(pr, name)}: unknown dtype; allowed: "
        + ", ".join(PrecisionConfig.DTYPES)
        for name in ("param_dtype", "reduce_dtype")
        if getattr(pr, name) not in PrecisionConfig.DTYPES
    ]
