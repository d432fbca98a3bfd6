"""Your own training script, run on every rank instead of the toolkit's task.

`script.path=train.py` (a file) or `script.module=mypkg.train` (`python -m`), with
`script.args='[--lr,3e-4]'`. Each rank gets the environment torchrun gives (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the NCCL profile;
the script creates its own process group. See docs/scripts.md.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.config.errors import control_characters, control_problem

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass
class ScriptConfig:
    path: str | None = None  # a Python file, run as `python PATH ARGS...`
    module: str | None = None  # a module, run as `python -m MODULE ARGS...`
    args: list[str] = field(default_factory=list)  # its command-line arguments, as given
    python: str | None = None  # the interpreter; None: the launcher's (it must import toolkit)
    # Where the script runs: None: the directory the launcher was started in.
    cwd: str | None = None

    @property
    def enabled(self) -> bool:
        return self.path is not None or self.module is not None

    def command_line(self) -> str:
        """The script's command line as a shell would take it (quoted)."""
        target = ["-m", self.module] if self.module else [str(self.path)]
        return shlex.join([self.python or "python", *target, *map(str, self.args)])


def problems(cfg: ScriptConfig) -> list[str]:
    """Problems with the script group, one line each."""
    p = []
    if cfg.path is not None and cfg.module is not None:
        p.append(
            f"script.path={cfg.path} and script.module={cfg.module}: give one of them, not both"
        )
    # These values end up in command lines and batch scripts: printable text on one line.
    for name in ("path", "module", "python", "cwd"):
        value = getattr(cfg, name)
        if value is not None and not value.strip():
            p.append(f"script.{name}='': name one, or leave it null")
        elif value is not None:
            p += control_problem(f"script.{name}", value)
    for i, arg in enumerate(cfg.args):
        p += control_problem(f"script.args[{i}]", str(arg))
    if (
        cfg.module is not None
        and not control_characters(cfg.module)
        and not _MODULE.fullmatch(cfg.module)
    ):
        p.append(f"script.module={cfg.module!r}: not a module name (e.g. mypkg.train)")
    if cfg.path is not None and cfg.path.strip() and not control_characters(cfg.path):
        where = Path(cfg.cwd or ".") / cfg.path
        if not where.is_file():
            p.append(f"script.path={cfg.path}: no such file ({where.resolve()})")
        elif where.suffix not in (".py", ""):
            p.append(f"script.path={cfg.path}: not a Python file (.py)")
    if (
        cfg.cwd is not None
        and cfg.cwd.strip()
        and not control_characters(cfg.cwd)
        and not Path(cfg.cwd).is_dir()
    ):
        p.append(f"script.cwd={cfg.cwd}: no such directory")
    if (cfg.args or cfg.python) and not cfg.enabled:
        p.append("script.args/script.python: set script.path or script.module too")
    return p


# The groups of a job that apply to a script run: the rest (model, data, optim, trainer, ...)
# are the built-in task's defaults, which the script never read.
SCRIPT_GROUPS = ("script", "cluster", "nccl", "telemetry", "fault", "launch", "checkpoint")


def described(config: dict[str, Any]) -> dict[str, Any]:
    """A script job (the job as a nested dict) as its trackers record it: the task, the
    script (path or module, arguments, interpreter, directory) and the groups that apply to
    it; never the default model's or trainer's settings, which it did not use. (The
    trackers redact it: toolkit.tracking.build.run_params.)"""
    kept = {"task": "script"} | {g: config[g] for g in SCRIPT_GROUPS if g in config}
    script = kept.get("script") or {}
    kept["script"] = {k: v for k, v in script.items() if v not in (None, [])}
    return kept
