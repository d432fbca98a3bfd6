"""How the launcher behaves once the job is built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LaunchConfig:
    detach: bool = False  # return right after submission
    dry_run: bool = False  # print what would be submitted; submit nothing
    follow: bool = True  # stream rank 0's output until the job ends
    kill_grace_s: float = 5.0  # after one rank fails, SIGTERM the rest, SIGKILL after this
    # Local ranks: `exec` starts each in a fresh interpreter; `fork` forks them from one
    # process that imported torch once (CPU ranks only); `auto` forks where there is no GPU.
    rank_start: str = "auto"


RANK_STARTS = ("auto", "exec", "fork")


def problems(cfg: LaunchConfig) -> list[str]:
    found = []
    if cfg.kill_grace_s < 0:
        found.append(f"launch.kill_grace_s={cfg.kill_grace_s}: must be >= 0 seconds")
    if cfg.rank_start not in RANK_STARTS:
        found.append(f"launch.rank_start={cfg.rank_start}: must be one of {', '.join(RANK_STARTS)}")
    return found
