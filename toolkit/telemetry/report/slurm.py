"""Slurm accounting for the report: `sacct -j JOBID --json` when sacct is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

SACCT_TIMEOUT_S = 15.0


def _job_summary(job: dict[str, Any]) -> dict[str, Any]:
    state = job.get("state", {})
    current = state.get("current") if isinstance(state, dict) else state
    if isinstance(current, list):
        current = ",".join(current)
    elapsed = job.get("time", {}).get("elapsed")
    return {
        "job_id": job.get("job_id"),
        "name": job.get("name"),
        "state": current,
        "elapsed_s": elapsed,
        "requeues": job.get("restart_cnt"),
        "nodes": job.get("nodes"),
        "exit_code": (job.get("exit_code") or {}).get("return_code"),
    }


PARSABLE_FIELDS = ("JobID", "JobName", "State", "ElapsedRaw", "NodeList", "AllocNodes")


def _run(exe: str, *args: str) -> subprocess.CompletedProcess | str:
    """sacct's answer, or the note saying why there is none."""
    try:
        return subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=SACCT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sacct failed: {type(exc).__name__}: accounting skipped"


def _parsable(
    exe: str, job_id: str, json_proc: subprocess.CompletedProcess
) -> tuple[dict[str, Any] | None, str]:
    proc = _run(exe, "-j", job_id, "-X", "-P", "-n", "-o", ",".join(PARSABLE_FIELDS))
    if isinstance(proc, str):
        return None, proc
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or json_proc.stderr.strip().splitlines() or ["?"])[
            0
        ]
        return None, f"sacct exited {proc.returncode} ({why[:200]}): accounting skipped"
    jobs = []
    for line in proc.stdout.splitlines():
        values = dict(zip(PARSABLE_FIELDS, line.split("|"), strict=False))
        if not values.get("JobID"):
            continue
        jobs.append(
            {
                "job_id": values["JobID"],
                "name": values.get("JobName"),
                "state": values.get("State"),
                "elapsed_s": int(values["ElapsedRaw"])
                if values.get("ElapsedRaw", "").isdigit()
                else None,
                "requeues": None,  # not in sacct's parsable fields
                "nodes": values.get("NodeList"),
                "exit_code": None,
            }
        )
    if not jobs:
        return None, f"sacct knows no job {job_id}"
    return {"jobs": jobs}, f"sacct (parsable): {len(jobs)} record(s) for job {job_id}"


def sacct(job_id: str) -> tuple[dict[str, Any] | None, str]:
    """(accounting summary or None, a note saying what happened)."""
    if not job_id or not job_id.split("_")[0].isdigit():
        return None, f"job id {job_id!r} is not a Slurm job: accounting skipped"
    exe = shutil.which("sacct")
    if exe is None:
        return None, "sacct not found on PATH: Slurm accounting skipped"
    proc = _run(exe, "-j", job_id, "--json")
    if isinstance(proc, str):
        return None, proc
    try:
        jobs = json.loads(proc.stdout).get("jobs", []) if proc.returncode == 0 else None
    except ValueError:
        jobs = None
    if jobs is None:  # no --json (Slurm < 21.08, or no JSON plugin): the parsable form
        return _parsable(exe, job_id, proc)
    if not jobs:
        return None, f"sacct knows no job {job_id}"
    summaries = [_job_summary(j) for j in jobs]
    return {"jobs": summaries}, f"sacct: {len(summaries)} record(s) for job {job_id}"
