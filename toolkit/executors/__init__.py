"""Executors start the ranks of prepared runs somewhere and report how they ended.

Every executor starts the same in-job entrypoint (`python -m toolkit.entrypoint RUN_DIR`);
they differ only in where the processes run. A dict of builders is the whole registry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from toolkit.config.job import JobConfig


@dataclass
class PreparedRun:
    job: JobConfig
    run_dir: Path
    overrides: list[str]


class Executor(Protocol):
    def run(self, runs: list[PreparedRun]) -> int:
        """Start every run (one job, or one array for a sweep); return the exit code."""
        ...


EXECUTORS: dict[str, str] = {
    "local": "toolkit.executors.local:LocalExecutor",
    "slurm": "toolkit.executors.slurm:SlurmExecutor",
}


def get_executor(kind: str) -> Executor:
    module, _, name = EXECUTORS[kind].partition(":")
    return getattr(importlib.import_module(module), name)()


def repo_root() -> Path:
    """The folder holding the toolkit package (added to PYTHONPATH of every rank)."""
    return Path(__file__).resolve().parents[2]
