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
    "script": "toolkit.tasks.script:run",  # your own script (script.path / script.module)
}
# Tasks whose ranks create their own process group: the entrypoint does not join one.
OWN_PROCESS_GROUP = frozenset({"script"})


def task_of(job: Any) -> str:
    """What the ranks run: `script` when a script is set (task=train, the default, gives way
    to it), else job.task."""
    return "script" if job.script.enabled and job.task == "train" else job.task


def resolve_task(name: str) -> Callable[..., Any]:
    module, _, func = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), func)


def task_problems(job: Any, world: int) -> list[str]:
    """The launcher's check of `task=` (a runtime check: config/ does not know the tasks)."""
    if job.task not in TASKS:
        return [f"task={job.task}: unknown task; allowed: {', '.join(sorted(TASKS))}"]
    if job.script.enabled and task_of(job) != "script":
        return [f"task={job.task}: runs the toolkit's task, not script.*; drop one of them"]
    if job.task == "script" and not job.script.enabled:
        return ["task=script: set script.path=train.py or script.module=mypkg.train"]
    if job.script.module is not None:
        return module_problems(job.script.module)
    return []


def module_problems(name: str) -> list[str]:
    """`script.module`: importable and runnable with `python -m` (a module, or a package
    with __main__)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return [f"script.module={name}: cannot be found ({exc})"]
    if spec is None:
        return [f"script.module={name}: no such module (is its package on PYTHONPATH?)"]
    if spec.submodule_search_locations is not None:
        try:
            main = importlib.util.find_spec(f"{name}.__main__")
        except (ImportError, ValueError):
            main = None
        if main is None:
            return [f"script.module={name}: a package without __main__.py; name its module"]
    elif spec.origin in (None, "built-in", "frozen") or not str(spec.origin).endswith(".py"):
        return [f"script.module={name}: not a Python source module ({spec.origin})"]
    return []
