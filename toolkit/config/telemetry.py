"""Per-node telemetry (owned by the telemetry component; see toolkit/telemetry/ and
docs/telemetry.md).

`TelemetryConfig` drives the in-job side (the node agent that samples GPUs, host and
InfiniBand and writes the node's HDF5 file); `ReportConfig` the post-run analysis
(`python -m toolkit.telemetry report`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.config.errors import ConfigError, below_minimum, not_one_of

COMPRESSIONS = ("gzip", "lzf", "none")
AGENT_LOST_ACTIONS = ("continue", "stop")
STRAGGLER_METRICS = (
    "step_time_s",
    "forward_backward_s",
    "optimizer_s",
    "data_wait_s",
    "compute_s",
)


def _check(problems: list[str]) -> None:
    if problems:
        raise ConfigError(problems)


@dataclass
class TelemetryConfig:
    enabled: bool = True  # on in real runs; telemetry=off turns it off
    interval_s: float = 1.0  # sampling interval of GPU/host/InfiniBand, 0.1 .. 3600
    flush_interval_s: float = 5.0  # how often buffered rows reach the file (SWMR readers see them)
    gpu: bool = True  # NVML sampling (absent driver: the gpu group is absent, attrs say why)
    gpm: bool = True  # Hopper+ GPM metrics (SM activity, occupancy, tensor, DRAM bandwidth)
    host: bool = True  # psutil: CPU, memory, load, disk, network per interface
    infiniband: bool = True  # port counters under sysfs_root
    sysfs_root: str = "/sys/class/infiniband"
    compression: str = "gzip"  # gzip | lzf | none
    compression_level: int = 4  # gzip only, 0..9
    chunk_rows: int = 1024  # rows per HDF5 chunk
    max_pending: int = 10000  # records a rank buffers while its node agent is unreachable
    close_timeout_s: float = 10.0  # how long rank close waits for the agent's final flush
    # Profiler windows (torch.profiler on every rank, RUN_DIR/profiles/step<N>/rank<k>.json.gz):
    profile_steps: list[int] = field(default_factory=list)  # [first, last] steps, inclusive
    profile_every: int = 0  # also open a window every N steps (0: never)
    profile_length: int = 3  # steps per window opened by profile_every or RUN_DIR/profile-now
    profile_on_demand: bool = True  # `touch RUN_DIR/profile-now` opens a window on every rank
    profile_memory: bool = False  # allocator events in the trace (profile_memory=True)
    profile_with_stack: bool = False  # Python stacks in the trace (costly)
    profile_cuda_snapshot: bool = False  # GPU memory snapshot per window (CUDA only)
    comm_timing: bool = True  # time collectives per kind and the exposed part in every step
    # A node agent that dies (killed, out of memory) is started again, up to this many times
    # per rank: its records and its hang watchdog come back (0: warn and go on without them).
    agent_restarts: int = 3
    # Once a node agent died and its restarts are used up (agent_restarts=0: at once):
    # "continue" training without node telemetry and hang watchdog (an error in the log), or
    # "stop" every rank after the next step, with the final checkpoint, one line and exit 81.
    on_agent_lost: str = "continue"

    def __post_init__(self) -> None:
        # The agent builds one from its spec: a bad value must fail there too.
        _check(problems(self))


def problems(cfg: TelemetryConfig) -> list[str]:
    """Problems with the telemetry group, one line each."""
    p = []
    if not 0.1 <= cfg.interval_s <= 3600:
        p.append(f"telemetry.interval_s={cfg.interval_s}: must be in [0.1, 3600] seconds")
    if not 0.1 <= cfg.flush_interval_s <= 3600:
        p.append(
            f"telemetry.flush_interval_s={cfg.flush_interval_s}: must be in [0.1, 3600] seconds"
        )
    if cfg.compression not in COMPRESSIONS:
        p.append(f"telemetry.compression={cfg.compression}: allowed: {', '.join(COMPRESSIONS)}")
    if not 0 <= cfg.compression_level <= 9:
        p.append(f"telemetry.compression_level={cfg.compression_level}: must be in 0..9")
    p += below_minimum("telemetry", cfg, {"chunk_rows": 16, "max_pending": 0, "close_timeout_s": 0})
    p += below_minimum("telemetry", cfg, {"agent_restarts": 0})
    p += not_one_of("telemetry", cfg, {"on_agent_lost": AGENT_LOST_ACTIONS})
    p += below_minimum("telemetry", cfg, {"profile_every": 0, "profile_length": 1})
    steps = list(cfg.profile_steps)
    if steps and (len(steps) != 2 or steps[0] < 1 or steps[1] < steps[0]):
        p.append(
            f"telemetry.profile_steps={steps}: must be [] or [first, last] with 1 <= first <= last"
        )
    return p


@dataclass
class ReportConfig:
    # A rank (or node) is a straggler when its median ratio to the per-step median of all
    # ranks exceeds 1 + straggler_margin on at least straggler_persistence of the steps.
    straggler_margin: float = 0.05
    straggler_persistence: float = 0.5
    straggler_metric: str = "step_time_s"
    # An idle gap: time between two steps of a rank, outside the steps, longer than
    # max(idle_gap_min_s, idle_gap_factor x the rank's median step time).
    idle_gap_min_s: float = 5.0
    idle_gap_factor: float = 5.0
    skip_first_steps: int = 1  # warm-up steps left out of the statistics
    plots: bool = True
    max_plot_points: int = 500  # per line; longer series are binned
    export: bool = True  # steps.csv, events.csv and trace.json
    sacct: bool = True  # join Slurm accounting when sacct is on PATH
    # Long runs are read through per-node summaries cached beside the node files (step
    # chunks instead of every step): "on", "off", or "auto" above stream_above_mb of files.
    stream: str = "auto"
    stream_above_mb: float = 256.0

    def __post_init__(self) -> None:
        p = []
        if self.straggler_margin <= 0:
            p.append(f"straggler_margin={self.straggler_margin}: must be > 0 (0.05 is 5 %)")
        if not 0 < self.straggler_persistence <= 1:
            p.append(f"straggler_persistence={self.straggler_persistence}: must be in (0, 1]")
        if self.straggler_metric not in STRAGGLER_METRICS:
            p.append(
                f"straggler_metric={self.straggler_metric}: allowed: {', '.join(STRAGGLER_METRICS)}"
            )
        if self.idle_gap_min_s < 0 or self.idle_gap_factor < 0:
            p.append(
                f"idle_gap_min_s={self.idle_gap_min_s}, idle_gap_factor={self.idle_gap_factor}: "
                "must be >= 0"
            )
        if self.skip_first_steps < 0:
            p.append(f"skip_first_steps={self.skip_first_steps}: must be >= 0")
        if self.stream not in ("auto", "on", "off"):
            p.append(f"stream={self.stream}: allowed: auto, on, off")
        if self.stream_above_mb < 0:
            p.append(f"stream_above_mb={self.stream_above_mb}: must be >= 0")
        if self.max_plot_points < 10:
            p.append(f"max_plot_points={self.max_plot_points}: must be >= 10")
        _check(p)
