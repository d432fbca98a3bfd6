"""`toolkit status [RUN_DIR|JOB_ID]` and `toolkit runs [DIR] [--json]`: where a run is, and
every run under a directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from toolkit import slurm_cli
from toolkit.cli.rundir import (
    RunDirUnreadable,
    RunInfo,
    find_runs,
    is_run_dir,
    read_members,
    read_run,
)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


DEAD_WHY = (
    " (the process that held RUN/.lock ended without a summary: nothing runs there; "
    "a relaunch into the run dir resumes from its last checkpoint)"
)


def rate(info: RunInfo) -> str:
    """The run's throughput in its model's unit: tokens/s for a token model, samples/s for
    any other (RUN/model.json)."""
    value = info.tokens_per_s if info.unit == "tokens" else info.samples_per_s
    return "-" if value is None else f"{value:,.0f} {info.unit}/s"


def mfu(info: RunInfo) -> str:
    """MFU from the model's FLOPs per sample (analytic, or counted), as a percentage."""
    return "-" if info.mfu is None else f"{100 * info.mfu:.2f}%"


def run_dir_of_job(job_id: str) -> Path | None:
    """The run dir of a Slurm job: its stdout is RUN_DIR/slurm/<id>_<task>_log.out."""
    try:
        records = slurm_cli.show_job(job_id, timeout_s=10)
    except slurm_cli.SlurmCommandError:
        return None
    out = records[0].std_out if records else ""
    return Path(out).parent.parent if out else None


def format_status(info: RunInfo) -> str:
    lines = [
        f"run dir     {info.run_dir}",
        f"state       {info.state}"
        + (
            f" (Slurm job {info.job_id}: {info.slurm_state or 'unknown to Slurm now'})"
            if info.job_id
            else DEAD_WHY
            if info.state == "dead"
            else ""
        ),
        *([f"script      {info.script}"] if info.script else []),
        f"step        {info.steps if info.steps is not None else '-'} / {info.total_steps or '-'}",
        f"loss        {_num(info.loss, '.4f')}",
        f"throughput  {rate(info)}",
        f"MFU         {mfu(info)}",
        f"checkpoint  {info.last_checkpoint or '-'}",
        f"attempts    {info.attempts} ({info.attempts - 1} restart(s) from a checkpoint)",
    ]
    if info.stop_reason is not None:
        lines.append(f"stopped     {info.stop_reason} (exit {info.exit_code})")
    lines.append("files")
    lines += [f"  {what:<12}{path}" for what, path in info.files.items()]
    if info.trackers:
        lines.append("trackers")
        lines += [f"  {name:<12}{link}" for name, link in info.trackers.items()]
    return "\n".join(lines)


def status(target: str, as_json: bool) -> int:
    path = Path(target)
    if not is_run_dir(path) and target.isdigit():
        path = run_dir_of_job(target) or path
    if not is_run_dir(path):
        print(
            f"error: {target}: not a run directory (config.yaml and launch.yaml) nor a known Slurm job"
        )
        return 2
    try:
        info = read_run(path)
    except RunDirUnreadable as exc:
        print(f"error: {exc}; repair or remove that file", file=sys.stderr)
        return 2
    print(json.dumps(info.as_dict(), indent=2) if as_json else format_status(info))
    return 0


def format_runs(infos: list[RunInfo]) -> str:
    header = (
        f"{'state':<10} {'steps':>11} {'loss':>8} {'throughput':>18} {'MFU':>7}  "
        f"{'run dir':<40} overrides"
    )
    rows = [header]
    for i in infos:
        steps = f"{i.steps if i.steps is not None else '-'}/{i.total_steps or '-'}"
        rows.append(
            f"{i.state:<10} {steps:>11} {_num(i.loss, '.4f'):>8} {rate(i):>18} {mfu(i):>7}"
            f"  {i.run_dir:<40} {' '.join(i.overrides)}"
        )
        rows += [f"{'':>61}{name}: {link}" for name, link in i.trackers.items()]
    return "\n".join(rows)


def runs(root: str, as_json: bool) -> int:
    path = Path(root)
    if not path.is_dir():
        print(f"error: {root}: no such directory")
        return 2
    infos = []
    for run_dir in find_runs(path):  # one damaged run dir is named, the others still listed
        try:
            info = read_run(run_dir)
            infos += [info, *read_members(info)]  # an ensemble's members, each like a run
        except RunDirUnreadable as exc:
            print(f"warning: skipped {run_dir}: {exc}", file=sys.stderr)
    if as_json:
        print(json.dumps([i.as_dict() for i in infos], indent=2))
    elif not infos:
        print(f"no run directories under {path}")
    else:
        print(format_runs(infos))
    return 0
