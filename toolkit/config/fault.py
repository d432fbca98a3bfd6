"""Fault injection, for tests and drills: every fault is off by default.

One group for every injected failure, so that a test (or a drill on a real cluster) says in
one place what goes wrong, and production configs never carry such fields elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HANG_WHERE = ("collective", "outside")


@dataclass
class FaultConfig:
    # The training loop raises on rank `fail_rank` at this step (a crashing rank).
    fail_at_step: int | None = None
    fail_rank: int = 0
    # The checkpoint writer fails with ENOSPC once a rank has written this many bytes of
    # one checkpoint (a full disk).
    save_enospc_after_bytes: int | None = None
    save_enospc_from_step: int | None = None  # only saves of this step and later; None: all
    # The checkpoint writer of the save at this step stalls for save_stall_s (a slow disk).
    save_stall_step: int | None = None
    save_stall_s: float = 3600.0
    # The training loop sleeps this long inside every step's data wait (a slow data loader).
    data_delay_s: float = 0.0
    # Rank `straggler_rank` sleeps straggler_sleep_s in every step's compute (a slow rank).
    straggler_rank: int | None = None
    straggler_sleep_s: float = 0.0
    # The hang watchdog (each node's telemetry agent; needs telemetry.enabled): a rank with
    # no progress (no phase boundary of the loop, no collective entered or left) for
    # hang_timeout_s is hung: every rank dumps its stacks into RUN_DIR/hangs/<time>/, the job
    # ends with exit status 79 (and is requeued on Slurm). null: max(300 s, 10 x the median
    # step time once steps are known). Startup, the first step, checkpoint loads and hooks
    # (checkpoint saves) get hang_startup_timeout_s.
    hang_watchdog: bool = True
    hang_timeout_s: float | None = None
    hang_startup_timeout_s: float = 1800.0
    # Rank `hang_rank` blocks forever after step hang_at_step: 'collective' just before the
    # step's all-reduce (the others wait in it), 'outside' at the top of the step. Only in
    # the job's first attempt (SLURM_RESTART_COUNT unset or 0): a requeued job resumes past it.
    hang_at_step: int | None = None
    hang_rank: int = 0
    hang_where: str = "collective"
    # The rank(s) on this node (Slurm's node name, else the host name) fail at fail_at_step
    # (default: the first step) with a hardware-like error (uncorrectable ECC): a bad node.
    fail_node: str | None = None

    # Bad nodes (not injections): a requeue leaves out the node that failed the attempt
    # (NODE_FAIL, a hardware error, XID/uncorrectable ECC in telemetry, a hang's stuck host).
    exclude_nodes: bool = True
    # The live straggler score: a rank whose median `compute_s` over a window of
    # straggler_window_steps steps exceeds the median of the other ranks' by straggler_margin
    # (0.2: 20 % slower) for straggler_windows consecutive windows is a straggler: an event and
    # a log line; exclude_on_requeue also marks its node to be left out at the next requeue.
    straggler_action: str = "warn"  # off | warn | exclude_on_requeue
    straggler_margin: float = 0.2
    straggler_windows: int = 3
    straggler_window_steps: int = 10

    STRAGGLER_ACTIONS = ("off", "warn", "exclude_on_requeue")


def problems(cfg: FaultConfig) -> list[str]:
    """Problems with the fault group, one line each."""
    p = []
    if cfg.fail_at_step is not None and cfg.fail_at_step < 1:
        p.append(f"fault.fail_at_step={cfg.fail_at_step}: must be >= 1 (or null)")
    if cfg.fail_rank < 0:
        p.append(f"fault.fail_rank={cfg.fail_rank}: must be >= 0")
    if cfg.save_enospc_after_bytes is not None and cfg.save_enospc_after_bytes < 0:
        p.append(f"fault.save_enospc_after_bytes={cfg.save_enospc_after_bytes}: must be >= 0")
    if cfg.save_enospc_from_step is not None and cfg.save_enospc_from_step < 1:
        p.append(f"fault.save_enospc_from_step={cfg.save_enospc_from_step}: must be >= 1 (or null)")
    if cfg.save_stall_s < 0:
        p.append(f"fault.save_stall_s={cfg.save_stall_s}: must be >= 0")
    if cfg.data_delay_s < 0:
        p.append(f"fault.data_delay_s={cfg.data_delay_s}: must be >= 0")
    if cfg.straggler_rank is not None and cfg.straggler_rank < 0:
        p.append(f"fault.straggler_rank={cfg.straggler_rank}: must be >= 0 (or null)")
    if cfg.straggler_sleep_s < 0:
        p.append(f"fault.straggler_sleep_s={cfg.straggler_sleep_s}: must be >= 0")
    for name, value in vars(cfg).items():  # NaN passes every comparison: refuse it first
        if isinstance(value, float) and math.isnan(value):
            p.append(f"fault.{name}=nan: must be a number")
    if cfg.hang_timeout_s is not None and not cfg.hang_timeout_s > 0:
        p.append(f"fault.hang_timeout_s={cfg.hang_timeout_s}: must be > 0 (or null: the default)")
    if not cfg.hang_startup_timeout_s > 0:
        p.append(f"fault.hang_startup_timeout_s={cfg.hang_startup_timeout_s}: must be > 0")
    elif cfg.hang_timeout_s is not None and cfg.hang_startup_timeout_s < cfg.hang_timeout_s:
        p.append(
            f"fault.hang_startup_timeout_s={cfg.hang_startup_timeout_s}: must be >= "
            f"fault.hang_timeout_s={cfg.hang_timeout_s} (startup is the longer limit)"
        )
    if cfg.hang_at_step is not None and cfg.hang_at_step < 1:
        p.append(f"fault.hang_at_step={cfg.hang_at_step}: must be >= 1 (or null)")
    if cfg.hang_rank < 0:
        p.append(f"fault.hang_rank={cfg.hang_rank}: must be >= 0")
    if cfg.hang_where not in HANG_WHERE:
        p.append(f"fault.hang_where={cfg.hang_where!r}: must be one of {', '.join(HANG_WHERE)}")
    if cfg.fail_node is not None and not cfg.fail_node.strip():
        p.append("fault.fail_node='': name a node (e.g. n2) or leave it null")
    if cfg.straggler_action not in cfg.STRAGGLER_ACTIONS:
        p.append(
            f"fault.straggler_action={cfg.straggler_action}: must be one of "
            + ", ".join(cfg.STRAGGLER_ACTIONS)
        )
    if not cfg.straggler_margin > 0:
        p.append(f"fault.straggler_margin={cfg.straggler_margin}: must be > 0 (0.2 is 20 %)")
    if cfg.straggler_windows < 1:
        p.append(f"fault.straggler_windows={cfg.straggler_windows}: must be >= 1")
    if cfg.straggler_window_steps < 1:
        p.append(f"fault.straggler_window_steps={cfg.straggler_window_steps}: must be >= 1")
    return p
