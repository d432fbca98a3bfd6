"""How the launcher behaves once the job is built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LaunchConfig:
    detach: bool = False  # return right after submission
    dry_run: bool = False  # print what would be submitted; submit nothing
    follow: bool = True  # stream rank 0's output until the job ends
    kill_grace_s: float = 5.0  # after one rank fails, SIGTERM the rest, SIGKILL after this


def problems(cfg: LaunchConfig) -> list[str]:
    if cfg.kill_grace_s < 0:
        return [f"launch.kill_grace_s={cfg.kill_grace_s}: must be >= 0 seconds"]
    return []
