"""The collective-communication benchmark (`task=bench_collectives`, toolkit/bench/collectives.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.config.errors import below_minimum


@dataclass
class CollectivesConfig:
    ops: list[str] = field(
        default_factory=lambda: [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "broadcast",
        ]
    )
    min_bytes: int = 8  # first size of the sweep (nccl-tests -b)
    # Last size (nccl-tests -e). null: 1 GiB on GPUs, 16 MiB on CPU; always bounded by memory.
    max_bytes: int | None = None
    step_factor: int = 2  # sizes grow by this factor (nccl-tests -f)
    warmup_iters: int = 5  # untimed iterations per size (nccl-tests -w)
    iters: int = 20  # timed iterations per size (nccl-tests -n)
    dtype: str = "float32"
    redop: str = "sum"  # sum | prod | min | max | avg (avg: NCCL, and gloo in recent PyTorch)
    root: int = 0  # broadcast root
    # How the per-rank time is combined (nccl-tests -a): avg (default) | max | min | rank0
    time_reduce: str = "avg"
    check: bool = True  # verify every result; wrong results fail the run
    # Fail the run (non-zero exit) when an op's average bus bandwidth is below this (GB/s).
    expected_busbw_gbps: float | None = None
    # Interleave a minimal hand-written timing loop (toolkit/collectives/baseline.py)
    # with the toolkit's measurement, `baseline_repeats` times per size, and report both.
    compare_baseline: bool = False
    baseline_repeats: int = 5

    OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
    DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")
    REDOPS = ("sum", "prod", "min", "max", "avg")
    TIME_REDUCE = ("avg", "max", "min", "rank0")


def problems(cfg: CollectivesConfig, world_size: int) -> list[str]:
    """One line per invalid field."""
    p = []
    bad_ops = [op for op in cfg.ops if op not in CollectivesConfig.OPS]
    if bad_ops or not cfg.ops:
        p.append(
            f"collectives.ops={list(cfg.ops)}: unknown or empty; allowed: "
            f"{', '.join(CollectivesConfig.OPS)}"
        )
    p += below_minimum(
        "collectives",
        cfg,
        {"min_bytes": 1, "step_factor": 2, "warmup_iters": 0, "iters": 1, "baseline_repeats": 1},
    )
    if cfg.max_bytes is not None and cfg.max_bytes < cfg.min_bytes:
        p.append(
            f"collectives.max_bytes={cfg.max_bytes}: must be >= collectives.min_bytes={cfg.min_bytes}"
        )
    if cfg.dtype not in CollectivesConfig.DTYPES:
        p.append(f"collectives.dtype={cfg.dtype}: allowed: {', '.join(CollectivesConfig.DTYPES)}")
    if cfg.redop not in CollectivesConfig.REDOPS:
        p.append(f"collectives.redop={cfg.redop}: allowed: {', '.join(CollectivesConfig.REDOPS)}")
    elif cfg.redop == "avg" and cfg.dtype.startswith("int"):
        p.append(
            f"collectives.redop=avg: needs a floating dtype, not collectives.dtype={cfg.dtype}"
        )
    if not 0 <= cfg.root < world_size:
        p.append(f"collectives.root={cfg.root}: must be a rank in 0..{world_size - 1}")
    if cfg.time_reduce not in CollectivesConfig.TIME_REDUCE:
        p.append(
            f"collectives.time_reduce={cfg.time_reduce}: allowed: "
            f"{', '.join(CollectivesConfig.TIME_REDUCE)}"
        )
    if cfg.expected_busbw_gbps is not None and cfg.expected_busbw_gbps <= 0:
        p.append(f"collectives.expected_busbw_gbps={cfg.expected_busbw_gbps}: must be > 0 or null")
    return p
