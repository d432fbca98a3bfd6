"""How the launcher behaves once the job is built."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class LaunchConfig:
    detach: bool = False  # return right after submission
    dry_run: bool = False  # print what would be submitted; submit nothing
    follow: bool = True  # stream rank 0's output until the job ends
    # After one rank fails, or once a rank's launcher is gone, SIGTERM the rest of the job
    # (ranks, scripts and what they started), SIGKILL what still runs after this long.
    kill_grace_s: float = 5.0
    # Local ranks: `exec` starts each in a fresh interpreter; `fork` forks them from one
    # process that imported torch once (CPU ranks only); `auto` forks where there is no GPU.
    rank_start: str = "auto"
    # A -m sweep: "auto" trains the runs that differ only in packable settings (seed, lr,
    # weight decay, warm-up, dropout: toolkit.config.trainer.PACKABLE) as one ensemble per
    # shape, one process (one Slurm job or array element) each (toolkit.pack); "off": one
    # process per run.
    pack: str = "off"
    # A rank's log file (logs/rank<k>.out, .err) past this many bytes is rotated to
    # rank<k>.out.1 (the one before is dropped): the newest output is kept, the disk is not
    # filled by a script that prints without end. 0: no cap.
    max_log_bytes: int = 256 * 1024 * 1024


RANK_STARTS = ("auto", "exec", "fork")
PACK_MODES = ("off", "auto")
MIN_LOG_BYTES = 4096


def problems(cfg: LaunchConfig) -> list[str]:
    found = []
    grace = cfg.kill_grace_s
    if not isinstance(grace, (int, float)) or not math.isfinite(grace) or grace < 0:
        found.append(
            f"launch.kill_grace_s={grace}: must be a finite number of seconds >= 0 "
            "(e.g. 5; 0: SIGKILL at once)"
        )
    if cfg.rank_start not in RANK_STARTS:
        found.append(f"launch.rank_start={cfg.rank_start}: must be one of {', '.join(RANK_STARTS)}")
    if cfg.pack not in PACK_MODES:
        found.append(
            f"launch.pack={cfg.pack}: must be one of {', '.join(PACK_MODES)} (auto packs a -m "
            "sweep's runs into ensembles)"
        )
    size = cfg.max_log_bytes
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or (0 < size < MIN_LOG_BYTES)
        or size < 0
    ):
        found.append(
            f"launch.max_log_bytes={size}: must be 0 (no cap) or a whole number of bytes "
            f">= {MIN_LOG_BYTES} (e.g. 268435456 for 256 MiB)"
        )
    return found
