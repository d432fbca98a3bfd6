"""Checkpointing (owned by the checkpoint component; see toolkit/checkpoint/)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckpointConfig:
    enabled: bool = False
    interval_steps: int = 0  # 0: only on demand / at preemption
    async_save: bool = True
    keep_last: int = 2
    keep_every: int = 0  # also keep every M-th step forever; 0: none
    resume: bool = True  # resume from the latest committed checkpoint in the run dir
    resume_from: str | None = None  # an explicit checkpoint directory
