"""Layer the variables (detected < profile < environment < nccl.env) and apply them.

Each variable keeps its source so the run directory says why it has the value it has.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from toolkit.config.nccl import NcclConfig
from toolkit.distributed.determinism import NCCL_DETERMINISTIC
from toolkit.nccl.detect import Decision
from toolkit.nccl.known import is_nccl_family

# Lowest to highest precedence.
SOURCES = ("detected", "profile", "deterministic", "environment", "config")


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    source: str  # one of SOURCES
    replaced: tuple[tuple[str, str], ...] = ()  # (source, value) of lower layers it beat


def toolkit_env(
    cfg: NcclConfig, rank: int, run_dir: Path, legacy_names: bool | None = None
) -> dict[str, str]:
    """The variables the typed fields stand for (debug output and PyTorch's NCCL backend).
    `legacy_names`: also set the flight recorder's pre-2.7 names (None: by torch version)."""
    if legacy_names is None:
        legacy_names = torch_uses_legacy_fr_names()
    out: dict[str, str] = {}
    nccl_dir = run_dir / "nccl"
    if cfg.debug is not None:
        out["NCCL_DEBUG"] = cfg.debug
        if cfg.debug_to_run_dir:
            # %h host, %p pid: NCCL substitutes them; one file per rank and process.
            out["NCCL_DEBUG_FILE"] = str(nccl_dir / f"debug-rank{rank}.%h.%p.log")
    if cfg.debug_subsys is not None:
        out["NCCL_DEBUG_SUBSYS"] = cfg.debug_subsys
    out["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = str(cfg.async_error_handling)
    entries = str(cfg.flight_recorder_entries)
    dump = cfg.dump_on_timeout and cfg.flight_recorder_entries > 0
    # PyTorch appends the rank: RUN_DIR/nccl/flight_recorder/rank_<k> (the <prefix>_<rank>
    # naming that torch.distributed.flight_recorder.fr_trace reads)
    prefix = str(nccl_dir / "flight_recorder" / "rank_")
    out["TORCH_FR_BUFFER_SIZE"] = entries
    if dump:
        out["TORCH_FR_DUMP_TEMP_FILE"] = prefix
        # A FIFO per rank (<stem><rank>.pipe, made by PyTorch's NCCL monitor thread): writing
        # to it dumps the flight recorder now. The hang watchdog does, before it ends a job.
        out["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] = str(nccl_dir / "flight_recorder" / "pipe_rank_")
    if legacy_names:
        # Older PyTorch reads only these; newer warns that they are deprecated.
        out["TORCH_NCCL_TRACE_BUFFER_SIZE"] = entries
        if dump:
            out["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = prefix
    out["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1" if dump else "0"
    return out


def torch_uses_legacy_fr_names() -> bool:
    """PyTorch before 2.7 reads TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE."""
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) < (2, 7)


def resolve(
    cfg: NcclConfig,
    decisions: list[Decision],
    environ: Mapping[str, str],
    rank: int,
    run_dir: Path,
    deterministic: bool = False,
) -> dict[str, Setting]:
    """Every variable this rank will run with, and where its value came from
    (`deterministic`: trainer.deterministic's fixed algorithm and protocol)."""
    layers: list[tuple[str, dict[str, str]]] = [
        (
            "detected",
            {d.name: d.value for d in decisions if d.name != "fabric" and d.value is not None},
        ),
        ("profile", {**toolkit_env(cfg, rank, run_dir), **cfg.profile_env}),
        ("deterministic", dict(NCCL_DETERMINISTIC) if deterministic else {}),
        ("environment", {k: v for k, v in environ.items() if is_nccl_family(k)}),
        ("config", dict(cfg.env)),
    ]
    settings: dict[str, Setting] = {}
    for source, values in layers:
        for name, value in values.items():
            value = str(value)
            previous = settings.get(name)
            replaced = previous.replaced if previous else ()
            if previous is not None and previous.value != value:
                replaced = (*replaced, (previous.source, previous.value))
            settings[name] = Setting(name, value, source, replaced)
    return dict(sorted(settings.items()))


def apply(settings: Mapping[str, Setting], environ: dict | None = None) -> None:
    """Export the settings into this process's environment (before any communicator exists)."""
    target = os.environ if environ is None else environ
    for name, setting in settings.items():
        target[name] = setting.value


def effective_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The NCCL_*, TORCH_NCCL_* and TORCH_FR_* variables this process runs with, sorted
    (for telemetry attributes and run records)."""
    source = os.environ if environ is None else environ
    return {k: source[k] for k in sorted(source) if is_nccl_family(k)}


def describe(setting: Setting) -> str:
    """One log line: value, source, and what it replaced."""
    line = f"{setting.name}={setting.value} ({setting.source})"
    if setting.replaced:
        beaten = ", ".join(f"{src} {val}" for src, val in setting.replaced)
        line += f", overrides {beaten}"
    return line
