"""What Slurm's commands answer, as typed records: the parsers of `scontrol show job`,
`sacct` (states, attempts, the report's summaries), `sinfo` and `sacctmgr show event` text,
and what a job state means (final, requeued, never runs). Text in, records out: no command
is run here (toolkit.slurm_cli runs them), so every parser is tested on answers recorded
from a real cluster (tests/executors/data/)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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


def parse_time(text: str) -> float | None:
    """Slurm's 'YYYY-MM-DDTHH:MM:SS' (local time) -> unix time; None for Unknown/N/A."""
    text = text.strip()
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def _exit_code(text: str) -> tuple[int, int]:
    code, _, sig = text.partition(":")
    return int(code or 0), int(sig or 0)


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """`sinfo -h -N -o '%N %t'` -> {node: short state}."""
    return dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)


@dataclass(frozen=True)
class NodeEvent:
    """One line of `sacctmgr show event`: a node's state change as accounting recorded it."""

    node: str
    state: str  # e.g. DOWN, DRAIN, FAIL
    reason: str
    start: str  # Slurm time, see parse_time


def parse_node_events(text: str) -> list[NodeEvent]:
    """`sacctmgr -n -P show event format=NodeName,State,Reason,TimeStart` -> events."""
    rows = [line.split("|") for line in text.splitlines()]
    return [NodeEvent(*row) for row in rows if len(row) == 4]


@dataclass(frozen=True)
class JobRecord:
    """One record of `scontrol show job -o` (one per job, or per group of array elements)."""

    job_id: str
    state: str  # JobState, e.g. RUNNING
    exit_code: int = 0
    signal: int = 0
    reason: str = ""  # why it is pending, e.g. Resources, PartitionNodeLimit
    requeue: bool = False  # Requeue=1
    restarts: int = 0  # times the job was requeued
    array_job_id: str = ""
    array_task_id: str = ""  # "3", or "0-3%2" for pending elements sharing one record
    partition: str = ""
    exc_node_list: str = ""  # "(null)" when none
    std_out: str = ""  # the path of the batch step's stdout
    end_time: float | None = None  # scheduled or actual end, unix

    def task_ids(self) -> list[int]:
        """The array elements this record stands for ([] for a plain job)."""
        return _task_ids(self.array_task_id) if self.array_job_id and self.array_task_id else []


def _task_ids(spec: str) -> list[int]:
    ids = []
    for part in spec.split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return ids


def parse_show_job(text: str) -> list[JobRecord]:
    """`scontrol show job -o` (one line per record) -> records."""
    records = []
    for line in text.splitlines():
        f = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobState" not in f:
            continue
        code, sig = _exit_code(f.get("ExitCode", "0:0"))
        records.append(
            JobRecord(
                job_id=f.get("JobId", ""),
                state=f["JobState"],
                exit_code=code,
                signal=sig,
                reason=f.get("Reason", ""),
                requeue=f.get("Requeue") == "1",
                restarts=int(f.get("Restarts", "0") or 0),
                array_job_id=f.get("ArrayJobId", ""),
                array_task_id=f.get("ArrayTaskId", ""),
                partition=f.get("Partition", ""),
                exc_node_list=f.get("ExcNodeList", ""),
                std_out=f.get("StdOut", ""),
                end_time=parse_time(f.get("EndTime", "")),
            )
        )
    return records


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


def states_of(records: list[JobRecord]) -> dict[str, JobState]:
    """{'123': state} for a job, {'120_0': ..., '120_1': ...} for an array's records."""
    states: dict[str, JobState] = {}
    for r in records:
        state = JobState(r.state, r.exit_code, r.signal, r.reason, r.requeue, r.restarts)
        ids = r.task_ids()
        if not ids:
            states[r.job_id] = state
        for index in ids:  # pending elements share one record: "0-3%2"
            states[f"{r.array_job_id}_{index}"] = state
    return states


def parse_sacct_states(text: str) -> dict[str, JobState]:
    """`sacct -n -X -P -o JobID,State,ExitCode` -> {job id: state}."""
    states = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 3:
            # "CANCELLED by 0" -> CANCELLED
            states[parts[0]] = JobState(parts[1].split()[0], *_exit_code(parts[2]))
    return states


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job (a requeue starts another), as `sacct -D` records it."""

    state: str  # e.g. NODE_FAIL, REQUEUED, RUNNING ("" when accounting has none yet)
    nodelist: str
    start: str  # Slurm time, see parse_time
    end: str

    @property
    def ended(self) -> bool:
        return self.state not in ("RUNNING", "PENDING", "")


def parse_attempts(text: str) -> list[Attempt]:
    """`sacct -n -D -X -P -o State,NodeList,Start,End` -> attempts, oldest first."""
    return [Attempt(*line.split("|")) for line in text.splitlines() if line.count("|") == 3]


# ---- accounting for the report ----

PARSABLE_FIELDS = ("JobID", "JobName", "State", "ElapsedRaw", "NodeList", "AllocNodes")


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


def parse_sacct_json(text: str) -> list[dict[str, Any]] | None:
    """`sacct --json` -> one summary per job; None when the text is not sacct's JSON."""
    try:
        jobs = json.loads(text).get("jobs", [])
    except (ValueError, AttributeError):
        return None
    return [_job_summary(j) for j in jobs]


def parse_sacct_parsable(text: str) -> list[dict[str, Any]]:
    """`sacct -X -P -n -o <PARSABLE_FIELDS>` -> the same summaries (fewer fields known)."""
    jobs = []
    for line in text.splitlines():
        values = dict(zip(PARSABLE_FIELDS, line.split("|"), strict=False))
        if not values.get("JobID"):
            continue
        elapsed = values.get("ElapsedRaw", "")
        jobs.append(
            {
                "job_id": values["JobID"],
                "name": values.get("JobName"),
                "state": values.get("State"),
                "elapsed_s": int(elapsed) if elapsed.isdigit() else None,
                "requeues": None,  # not in sacct's parsable fields
                "nodes": values.get("NodeList"),
                "exit_code": None,
            }
        )
    return jobs
