"""Asking Slurm about the cluster and about jobs: reachability, states, exit codes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

# States after which a job never runs again by itself (REQUEUED and PENDING are not final).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
    }
)
# Final for a job without --requeue; a requeueable job comes back from these.
REQUEUED_AFTER = frozenset({"PREEMPTED", "NODE_FAIL"})
# Pending reasons that never clear by themselves: the request exceeds what the partition, QOS
# or association allows (clusters without EnforcePartLimits accept such jobs and keep them).
NEVER_RUNS = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "BadConstraints",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
        "AssocMaxNodesPerJobLimit",
        "AssocMaxWallDurationPerJobLimit",
    }
)
HOW_TO_POINT = (
    "point SLURM_CONF at your cluster's slurm.conf (or run on a login node), or start the "
    'local dev cluster: scripts/dev-cluster up && eval "$(scripts/dev-cluster env)"'
)


@dataclass(frozen=True)
class JobState:
    state: str  # e.g. RUNNING, COMPLETED, FAILED
    exit_code: int  # the batch script's exit code
    signal: int  # the signal that ended it, 0 if none
    reason: str = ""  # why it is pending, e.g. Resources, Priority, PartitionNodeLimit
    requeue: bool = False  # Slurm puts it back in the queue after preemption or node failure
    restarts: int = 0  # times the job was requeued (scontrol's Restarts)

    @property
    def final(self) -> bool:
        if self.requeue and self.state in REQUEUED_AFTER:
            return False  # it will be PENDING again in a moment
        return self.state in FINAL_STATES

    @property
    def never_runs(self) -> bool:
        return self.state == "PENDING" and self.reason in NEVER_RUNS

    def exit_status(self) -> int:
        """What `launch` exits with: 0 only for COMPLETED."""
        if self.state == "COMPLETED":
            return 0
        if self.exit_code:
            return self.exit_code
        return 128 + self.signal if self.signal else 1


def unreachable_reason(timeout_s: float = 20) -> str | None:
    """Why Slurm cannot take a job from here, as one line, or None when it can."""
    if shutil.which("sbatch") is None:
        return f"cluster=slurm: no `sbatch` on PATH; {HOW_TO_POINT}"
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "the default slurm.conf"
    if conf and not os.path.isfile(conf):
        return f"cluster=slurm: {where} does not exist; {HOW_TO_POINT}"
    try:
        proc = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cluster=slurm: slurmctld did not answer ({where}): {exc}; {HOW_TO_POINT}"
    if proc.returncode != 0 or " is UP" not in proc.stdout:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        why = detail[0] if detail else f"scontrol ping exited {proc.returncode}"
        return f"cluster=slurm: slurmctld is not reachable ({where}): {why}; {HOW_TO_POINT}"
    return None


def _exit_code(text: str) -> tuple[int, int]:
    code, _, sig = text.partition(":")
    return int(code or 0), int(sig or 0)


def _scontrol_states(job_id: str) -> dict[str, JobState] | None:
    """States of a job, or of every element of an array, while slurmctld still knows it."""
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        return None  # purged after MinJobAge: ask accounting
    states: dict[str, JobState] = {}
    for line in proc.stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobState" not in fields:
            continue
        state = JobState(
            fields["JobState"],
            *_exit_code(fields.get("ExitCode", "0:0")),
            reason=fields.get("Reason", ""),
            requeue=fields.get("Requeue") == "1",
            restarts=int(fields.get("Restarts", "0") or 0),
        )
        array_job, task = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
        if not array_job or task is None:
            states[fields["JobId"]] = state
            continue
        for index in _task_ids(task):  # pending elements share one record: "0-3%2"
            states[f"{array_job}_{index}"] = state
    return states


def _task_ids(spec: str) -> list[int]:
    ids = []
    for part in spec.split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return ids


def _sacct_states(job_id: str) -> dict[str, JobState]:
    proc = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State,ExitCode"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    states = {}
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 3:
            # "CANCELLED by 0" -> CANCELLED
            states[parts[0]] = JobState(parts[1].split()[0], *_exit_code(parts[2]))
    return states


def job_states(job_id: str) -> dict[str, JobState]:
    """{'123': state} for a job, {'120_0': ..., '120_1': ...} for an array."""
    states = _scontrol_states(job_id)
    return states if states is not None else _sacct_states(job_id)


def failed_task(batch_stderr: str) -> int | None:
    """The first task srun reported as failed ("srun: error: n2: task 1: Exited ...")."""
    m = re.search(r"task (\d+): (?:Exited|Killed|Terminated|Segmentation|Aborted)", batch_stderr)
    return int(m.group(1)) if m else None


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)
