"""What one device of the machine achieves: peaks, achievable fractions, links and latencies.

A preset (conf/hardware/*.yaml) or a profile measured by `python -m toolkit.measure.hardware`
fills it. The performance model never assumes a kernel runs at the peak: matmuls run at
`peak_flops(dtype) * matmul_fraction(m, n, k, dtype)` (nearest measured shape), causal
attention at the attention table's fraction, norms and activations at
`memory_bandwidth * elementwise_fraction`. Each number's source is in `source` and in the
YAML's comments.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.config.errors import ConfigError


@dataclass
class GemmPoint:
    """Achieved FLOP/s of one (m x k) @ (k x n) GEMM, as a fraction of the dtype's peak."""

    m: int = 1
    n: int = 1
    k: int = 1
    dtype: str = "float32"
    fraction: float = 1.0


@dataclass
class AttentionPoint:
    """Achieved SDPA (forward + backward) FLOP/s, counting the executed FLOPs (causal: half of
    the score matrix), as a fraction of the dtype's peak."""

    seq_len: int = 1
    head_dim: int = 64
    dtype: str = "float32"
    fraction: float = 1.0
    causal: bool = True


@dataclass
class HardwareConfig:
    name: str = "cpu"
    source: str = "nominal numbers (no measurement)"  # where the numbers come from
    peak_flops_fp32: float = 1.0e11  # dense FLOP/s per device
    peak_flops_bf16: float = 1.0e11
    memory_bandwidth: float = 2.0e10  # bytes/s per device (stream copy/triad)
    memory_bytes: float = 1.6e10  # device memory per device
    intra_node_bandwidth: float = 1.0e10  # bytes/s per device (NVLink; shared memory on CPU)
    inter_node_bandwidth: float = 1.25e9  # bytes/s per NIC
    nics_per_node: int = 1  # rails: a node's inter-node bandwidth is NICs x per-NIC
    intra_node_latency_s: float = 2.0e-5  # per collective call
    inter_node_latency_s: float = 5.0e-5
    # per ring step / tree level of a collective, inside a node and across nodes (NCCL's
    # hwLatencies); 0: the call latency is the whole latency (gloo's, measured per call)
    intra_node_step_latency_s: float = 0.0
    inter_node_step_latency_s: float = 0.0
    host_device_bandwidth: float = 2.0e10  # bytes/s host<->device (CPU: memory bandwidth)
    elementwise_fraction: float = 1.0  # norm/activation/loss kernels, of memory_bandwidth
    op_overhead_s: float = 1.0e-5  # per kernel launch / eager op dispatch
    # per foreach op of clipping + AdamW over sharded (DTensor) parameters, per tensor on CPU
    optimizer_op_overhead_s: float = 1.0e-5
    # per FSDP2 unit all-gather / reduce-scatter: hooks, copy-in/out, DTensor bookkeeping
    fsdp_collective_overhead_s: float = 1.0e-4
    # FSDP2's copy-in/copy-out (gather and reduce buffers, casts) run at memory_bandwidth x
    # this: 1 for a device copy kernel into the caching allocator's memory (GPU, assumed);
    # toolkit.measure.hardware measures it (fully_shard on a 1-rank mesh minus without).
    fsdp_copy_fraction: float = 1.0
    # Fraction of the compute time behind which FSDP's collectives can hide: 1 with copy
    # engines and separate streams (GPU); 0 where gloo's threads take the same cores (CPU).
    comm_overlap: float = 1.0
    # CPU only: the cores a node's ranks share (the profile's rates are per core and the
    # toolkit gives each rank cores // ranks threads); 0 = one device per rank (GPU).
    cores_per_node: int = 0
    # CPU: rate of one process with all the cores' threads / (cores x one thread's rate).
    thread_efficiency: float = 1.0
    # CPU: op_overhead_s measured with all the cores' threads in one process (each op's
    # parallel region waits for every thread; on a loaded machine that costs).
    threaded_op_overhead_s: float = 1.0e-5
    # Relative uncertainty of a predicted step time on this hardware (0.3: the truth is
    # expected within step/1.3 .. step*1.3), stated by whoever wrote the numbers.
    uncertainty: float = 0.3
    # Seconds of toolkit.measure.kernel_rates.speed_probe (one thread: a GEMM and a GELU
    # forward + backward) when the profile was measured; a benchmark that runs the probe
    # again says how much faster or slower the machine is now. 0: not measured (presets).
    probe_s: float = 0.0
    # Streaming multiprocessors per device (datasheet). > 0 turns on the GEMM size ramp of
    # toolkit.perfmodel.kernels.gemm_seconds (tile and wave quantization, memory bound): the
    # `matmul` table then holds large-GEMM ceilings. 0: the table is taken as it is (CPU; a
    # measured profile, whose table already holds each shape's own rate).
    num_sms: int = 0
    matmul: list[GemmPoint] = field(default_factory=list)
    attention: list[AttentionPoint] = field(default_factory=list)

    def peak_flops(self, dtype: str) -> float:
        return self.peak_flops_bf16 if dtype in ("bfloat16", "float16") else self.peak_flops_fp32

    def matmul_fraction(self, m: int, n: int, k: int, dtype: str) -> float:
        """The measured fraction of the shape nearest in log space; 1.0 without a table."""
        shapes = [((p.m, p.n, p.k), p.dtype, p.fraction) for p in self.matmul]
        return nearest_fraction(shapes, (m, n, k), dtype)

    def attention_fraction(
        self, seq_len: int, head_dim: int, dtype: str, causal: bool = True
    ) -> float:
        """The nearest (seq_len, head_dim) point of the same masking (causal or not) where the
        table has one; 1.0 without a table."""
        points = [p for p in self.attention if p.causal == causal] or self.attention
        shapes = [((p.seq_len, p.head_dim), p.dtype, p.fraction) for p in points]
        return nearest_fraction(shapes, (seq_len, head_dim), dtype)


def nearest_fraction(
    table: list[tuple[tuple[int, ...], str, float]], shape: tuple[int, ...], dtype: str
) -> float:
    """The fraction of the table's shape nearest to `shape` in log space, preferring entries
    of the same dtype; 1.0 (the peak) for an empty table."""
    rows = [row for row in table if row[1] == dtype] or table
    if not rows:
        return 1.0

    def distance(row: tuple[tuple[int, ...], str, float]) -> float:
        return sum(math.log(a / b) ** 2 for a, b in zip(row[0], shape, strict=True))

    return min(rows, key=distance)[2]


# Fields that may be zero (the others divide somewhere and must be > 0).
MAY_BE_ZERO = (
    "cores_per_node",
    "comm_overlap",
    "op_overhead_s",
    "optimizer_op_overhead_s",
    "fsdp_collective_overhead_s",
    "threaded_op_overhead_s",
    "uncertainty",
    "probe_s",
    "num_sms",
    "intra_node_latency_s",
    "inter_node_latency_s",
    "intra_node_step_latency_s",
    "inter_node_step_latency_s",
)


def problems(hw: HardwareConfig) -> list[str]:
    """Every rate and size must be positive (they divide in MFU and the performance model);
    fractions lie in (0, 1]."""
    found = []
    for f in dataclasses.fields(hw):
        value = getattr(hw, f.name)
        if f.name in ("name", "source", "matmul", "attention"):
            continue
        if f.name in MAY_BE_ZERO:
            if value < 0:
                found.append(f"hardware.{f.name}={value}: must be >= 0")
        elif not value > 0:
            found.append(f"hardware.{f.name}={value}: must be > 0")
    if not 0 < hw.elementwise_fraction <= 1:
        found.append(f"hardware.elementwise_fraction={hw.elementwise_fraction}: must be in (0, 1]")
    if not 0 < hw.fsdp_copy_fraction <= 1:
        found.append(f"hardware.fsdp_copy_fraction={hw.fsdp_copy_fraction}: must be in (0, 1]")
    if not 0 < hw.thread_efficiency <= 1:
        found.append(f"hardware.thread_efficiency={hw.thread_efficiency}: must be in (0, 1]")
    if hw.comm_overlap > 1:
        found.append(f"hardware.comm_overlap={hw.comm_overlap}: must be in [0, 1]")
    for table, points in (("matmul", hw.matmul), ("attention", hw.attention)):
        for i, p in enumerate(points):
            if not 0 < p.fraction <= 1:
                found.append(f"hardware.{table}[{i}].fraction={p.fraction}: must be in (0, 1]")
    return found


ADDED_LATER = ("intra_node_step_latency_s", "inter_node_step_latency_s", "num_sms")


def load_profile(path: Path) -> HardwareConfig:
    """A hardware profile file (as written by `python -m toolkit.measure.hardware`): every field
    of the schema must be present; a missing or misspelled field is one ConfigError line."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except (OSError, OmegaConfBaseException) as exc:
        raise ConfigError([f"{path}: cannot read the hardware profile: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: a hardware profile is a mapping of fields"])
    data.pop("defaults", None)
    names = [f.name for f in dataclasses.fields(HardwareConfig)]
    # Fields added after a profile could have been measured, with the value a measurement
    # writes (0: the measured call latency is the whole latency; no GEMM ramp over SMs, the
    # measured table holds each shape's rate), so an older profile loads.
    for name in ADDED_LATER:
        data.setdefault(name, 0)
    missing = [n for n in names if n not in data]
    unknown = [k for k in data if k not in names]
    found = []
    if missing:
        found.append(f"{path}: missing field(s) {', '.join(missing)}")
    if unknown:
        found.append(f"{path}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
    if found:
        raise ConfigError(found)
    try:
        hw = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), data))
    except OmegaConfBaseException as exc:
        raise ConfigError([f"{path}: {str(exc).splitlines()[0]}"]) from None
    assert isinstance(hw, HardwareConfig)
    found = problems(hw)
    if found:
        raise ConfigError([f"{path}: {line}" for line in found])
    return hw
