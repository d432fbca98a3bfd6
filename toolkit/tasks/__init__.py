"""Tasks: what every rank runs once the process group is up (`task=` in the job config).

A task is the composition root inside a rank: it builds the components from their own
configs (trainer, checkpoint, telemetry, scheduler control) and wires them together. The
table maps a name to "module:function(job, env, run_dir, device)", imported lazily so that
the launcher can check names without importing torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

TASKS: dict[str, str] = {
    "train": "toolkit.tasks.train:run",
    "bench_collectives": "toolkit.tasks.bench_collectives:run",
    "bench_train": "toolkit.tasks.bench_train:run",  # task=train plus memory probes
}


def resolve_task(name: str) -> Callable[..., Any]:
    module, _, func = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), func)


def task_problems(job: Any, world: int) -> list[str]:
    """The launcher's check of `task=` (a runtime check: config/ does not know the tasks)."""
    if job.task not in TASKS:
        return [f"task={job.task}: unknown task; allowed: {', '.join(sorted(TASKS))}"]
    return []
