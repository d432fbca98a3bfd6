"""NCCL / collective-communication tuning (the logic lives in toolkit/nccl/).

Precedence of a variable, lowest to highest (docs/nccl.md):
  detected on the node (profile auto, and node-specific values of the network profiles)
  < the profile's YAML (`profile_env`) and the typed fields below
  < variables already set in the environment the rank starts with
  < `nccl.env` (explicit in the job config, recorded in RUN_DIR/config.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NcclConfig:
    # auto | infiniband | roce | ethernet | single_node (conf/nccl/<profile>.yaml)
    profile: str = "auto"
    # The profile's static settings (set by conf/nccl/<profile>.yaml, documented there).
    profile_env: dict[str, str] = field(default_factory=dict)
    # User overrides; they win over everything: nccl.env.NCCL_IB_HCA=mlx5_0
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0  # process-group timeout (init_process_group(timeout=...))
    # Root under which sys/class/infiniband, sys/class/net, sys/bus/pci and proc/net/route
    # are read; tests point it at a recorded tree.
    sysfs_root: str = "/"
    # NCCL_DEBUG (VERSION | WARN | INFO | TRACE); null leaves it unset.
    debug: str | None = "WARN"
    # NCCL_DEBUG_SUBSYS, e.g. "INIT,NET"; null leaves it unset (NCCL's default: INIT,BOOTSTRAP,ENV).
    debug_subsys: str | None = None
    # NCCL_DEBUG_FILE=RUN_DIR/nccl/debug-rank<k>.%h.%p.log (one file per rank) when true.
    debug_to_run_dir: bool = True
    # TORCH_NCCL_ASYNC_ERROR_HANDLING: 3 = abort the communicator on a failed/timed-out
    # collective without tearing down the process (PyTorch's default in 2.x).
    async_error_handling: int = 3
    # TORCH_FR_BUFFER_SIZE (and its older name TORCH_NCCL_TRACE_BUFFER_SIZE): number of
    # collectives the flight recorder keeps per rank; 0 disables it.
    flight_recorder_entries: int = 2000
    # TORCH_NCCL_DUMP_ON_TIMEOUT=1 and the dump path RUN_DIR/nccl/flight_recorder/rank_<k>.
    dump_on_timeout: bool = True

    PROFILES = ("auto", "infiniband", "roce", "ethernet", "single_node")
    DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE", "ABORT")


def problems(cfg: NcclConfig, num_nodes: int) -> list[str]:
    """The plain fields, one line each. The variables themselves are checked against what
    NCCL knows by the launcher (toolkit.nccl.checks), which has that knowledge."""
    problems: list[str] = []
    if cfg.profile not in NcclConfig.PROFILES:
        problems.append(
            f"nccl.profile={cfg.profile}: unknown profile; allowed: {', '.join(NcclConfig.PROFILES)}"
        )
    if cfg.profile == "single_node" and num_nodes > 1:
        problems.append(
            f"nccl=single_node: for one node, but cluster.nodes={num_nodes}; use nccl=auto "
            "(or infiniband/roce/ethernet)"
        )
    if cfg.timeout_s <= 0:
        problems.append(f"nccl.timeout_s={cfg.timeout_s}: must be > 0 seconds")
    if cfg.debug is not None and cfg.debug.upper() not in NcclConfig.DEBUG_LEVELS:
        problems.append(
            f"nccl.debug={cfg.debug}: allowed: {', '.join(NcclConfig.DEBUG_LEVELS)} or null"
        )
    if not 0 <= cfg.async_error_handling <= 3:
        problems.append(f"nccl.async_error_handling={cfg.async_error_handling}: must be in 0..3")
    if cfg.flight_recorder_entries < 0:
        problems.append(
            f"nccl.flight_recorder_entries={cfg.flight_recorder_entries}: must be >= 0 (0 disables)"
        )
    return problems
