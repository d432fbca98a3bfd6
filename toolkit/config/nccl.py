"""NCCL / collective-communication tuning (owned by toolkit/nccl/)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NcclConfig:
    profile: str = "auto"
    env: dict[str, str] = field(default_factory=dict)  # user overrides; they win
    timeout_s: float = 600.0  # process-group timeout
