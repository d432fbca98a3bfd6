"""`task=bench_train`: the normal training task plus memory probes for the benchmark.

Same trainer as `task=train` (built by toolkit.tasks.train.build_trainer); in addition each
rank records, into RUN_DIR/bench/memory-rank<k>.json, how much memory the model, its
optimizer state and one step added, so the performance model's memory estimate can be
checked: on CPU by resident set size (RSS) growth, on CUDA by torch.cuda memory counters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import torch

from toolkit.config.job import JobConfig
from toolkit.distributed.env import DistEnv
from toolkit.events import StepRecord
from toolkit.hooks import Hook, Stop, TrainerView


def memory_now(device: torch.device) -> dict[str, int]:
    """Current and peak bytes: CUDA allocator counters on GPU, process RSS on CPU."""
    if device.type == "cuda":
        return {
            "allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
        }
    return {"rss_bytes": int(psutil.Process().memory_info().rss)}


class MemoryProbe(Hook):
    """A loop hook: memory before training, after the first step (parameters and optimizer
    state now exist, gradients were freed by zero_grad) and at the end."""

    def __init__(self, path: Path, device: torch.device, before_build: dict[str, int]):
        self.path = path
        self.device = device
        self.samples: dict[str, Any] = {"device": device.type, "before_build": before_build}

    def on_start(self, trainer: TrainerView) -> None:
        self.samples["after_build"] = memory_now(self.device)

    def after_step(
        self, trainer: TrainerView, record: StepRecord, votes: list[float]
    ) -> Stop | None:
        if record.step == 1:
            self.samples["after_first_step"] = memory_now(self.device)
        return None

    def on_end(self, trainer: TrainerView) -> None:
        self.samples["end"] = memory_now(self.device)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.samples, indent=2))


def run(job: JobConfig, env: DistEnv, run_dir: Path, device: torch.device) -> dict[str, Any]:
    from toolkit.tasks.train import build_trainer, fit_and_report

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = memory_now(device)
    trainer = build_trainer(job, env, run_dir, device)
    trainer.hooks.append(
        MemoryProbe(run_dir / "bench" / f"memory-rank{env.rank}.json", device, before)
    )
    return fit_and_report(trainer, env, run_dir)
