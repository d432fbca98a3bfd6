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


def sacct(job_id: str) -> tuple[dict[str, Any] | None, str]:
    """(accounting summary or None, a note saying what happened)."""
    if not job_id or not job_id.split("_")[0].isdigit():
        return None, f"job id {job_id!r} is not a Slurm job: accounting skipped"
    exe = shutil.which("sacct")
    if exe is None:
        return None, "sacct not found on PATH: Slurm accounting skipped"
    try:
        proc = subprocess.run(
            [exe, "-j", job_id, "--json"],
            capture_output=True,
            text=True,
            timeout=SACCT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"sacct failed: {type(exc).__name__}: accounting skipped"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[0]
        return None, f"sacct exited {proc.returncode} ({why[:200]}): accounting skipped"
    try:
        jobs = json.loads(proc.stdout).get("jobs", [])
    except ValueError:
        return None, "sacct printed no JSON (Slurm older than 21.08?): accounting skipped"
    if not jobs:
        return None, f"sacct knows no job {job_id}"
    summaries = [_job_summary(j) for j in jobs]
    return {"jobs": summaries}, f"sacct: {len(summaries)} record(s) for job {job_id}"
