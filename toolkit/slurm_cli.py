"""Every call of Slurm's commands (scontrol, sacct, squeue, sinfo, sacctmgr, scancel) and the
parsing of their answers, in one place: typed records in, typed records out.

One wrapper (`run`) starts them all, under a time limit; a command that is missing, times
out or (when asked to be checked) exits non-zero raises `SlurmCommandError`, one line. The
parsers take the text of an answer, so they are tested on answers recorded from a real
cluster (tests/executors/data/). Decisions (what a state means for the launcher, when to
requeue, which node to leave out) live with their callers in toolkit.executors; this module
sits at the bottom and imports nothing of the toolkit, so the launcher, the in-job hooks, the
report, the CLI and the nodelist expansion of toolkit.distributed all use it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0

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


class SlurmCommandError(RuntimeError):
    """A Slurm command that is missing, timed out or failed; the message is one line."""


# `scontrol requeue` of the job it runs in makes Slurm send SIGTERM to every process of the
# job, that scontrol among them, often before it has read the answer ("died with SIGTERM":
# the requeue went through, the caller cannot tell, and the StartTime=now that follows is
# never sent, so the job waits out Slurm's ~120 s hold). Such commands start with SIGTERM
# ignored: a disposition set to SIG_IGN survives exec, and SIGKILL after KillWait still ends
# them. (subprocess's preexec_fn would do it in the child, but is unsafe in a threaded rank.)
_IGNORING_SIGTERM = (
    "import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def run(
    *args: str, timeout_s: float = TIMEOUT_S, check: bool = False, outlive_term: bool = False
) -> subprocess.CompletedProcess:
    """Run one Slurm command and capture its text. SlurmCommandError when the command is not
    on PATH, does not answer within timeout_s, or (check=True) exits non-zero.
    `outlive_term`: the command ignores SIGTERM (for commands that end the caller's job)."""
    command = " ".join(args[:3])
    argv = list(args)
    if outlive_term:
        if shutil.which(args[0]) is None:
            raise SlurmCommandError(f"{args[0]}: not found on PATH")
        argv = [sys.executable, "-I", "-S", "-c", _IGNORING_SIGTERM, *argv]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SlurmCommandError(f"{args[0]}: not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{command}: no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise SlurmCommandError(f"{command}: {exc}") from None
    if check and done.returncode != 0:
        raise SlurmCommandError(f"{command}: {first_line(done)}")
    return done


def first_line(done: subprocess.CompletedProcess) -> str:
    """The first line of what a command said (stderr, else stdout), else its exit status."""
    detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return detail[0] if detail else f"exited {done.returncode}"


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


# ---- the cluster ----


def ping(timeout_s: float = 20) -> str | None:
    """None when slurmctld answers `scontrol ping` as UP, else why not (one line)."""
    done = run("scontrol", "ping", timeout_s=timeout_s)
    if done.returncode != 0 or " is UP" not in done.stdout:
        detail = first_line(done)
        return detail if detail != f"exited {done.returncode}" else f"scontrol ping {detail}"
    return None


def hostnames(nodelist: str) -> list[str] | None:
    """`scontrol show hostnames`: 'n[1-3]' -> ['n1', 'n2', 'n3']; None when scontrol is not
    installed or could not answer (the caller parses the common forms itself)."""
    if shutil.which("scontrol") is None:
        return None
    try:
        out = run("scontrol", "show", "hostnames", nodelist, timeout_s=10, check=True).stdout
    except SlurmCommandError:
        return None
    return out.split() or None


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """`sinfo -h -N -o '%N %t'` -> {node: short state}."""
    return dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)


def node_states(partition: str | None = None, nodes: list[str] | None = None) -> dict[str, str]:
    """{node: sinfo short state} of a partition (or of some nodes); {} when sinfo cannot say."""
    cmd = ["sinfo", "-h", "-N", "-o", "%N %t"]
    if partition:
        cmd += ["-p", partition]
    if nodes:
        cmd += ["-n", ",".join(nodes)]
    try:
        return parse_sinfo_nodes(run(*cmd).stdout)
    except SlurmCommandError:
        return {}


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


def node_events(nodes: list[str], start: str) -> list[NodeEvent]:
    """Accounting's node events of `nodes` since `start` ([] when sacctmgr cannot say)."""
    try:
        out = run("sacctmgr", "-n", "-P", "show", "event", f"Nodes={','.join(nodes)}",
                  f"Start={start}", "format=NodeName,State,Reason,TimeStart").stdout  # fmt: skip
    except SlurmCommandError:
        return []
    return parse_node_events(out)


# ---- jobs ----


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


def show_job(job_id: str, timeout_s: float = TIMEOUT_S) -> list[JobRecord] | None:
    """The job's records while slurmctld knows it; None once it was purged (MinJobAge) or
    never existed. SlurmCommandError when scontrol cannot be asked."""
    done = run("scontrol", "show", "job", "-o", job_id, timeout_s=timeout_s)
    return parse_show_job(done.stdout) if done.returncode == 0 else None


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


def job_states(job_id: str) -> dict[str, JobState]:
    """{'123': state} for a job, {'120_0': ..., '120_1': ...} for an array: from slurmctld
    while it knows the job, then from accounting."""
    records = show_job(job_id)
    if records is not None:
        return states_of(records)
    out = run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State,ExitCode").stdout
    return parse_sacct_states(out)


def state_word(job_id: str) -> str | None:
    """Slurm's state of a job in one word (squeue, else accounting); None when Slurm cannot
    be asked or does not know it."""
    for cmd in (
        ["squeue", "-h", "-j", job_id, "-o", "%T"],
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
    ):
        try:
            done = run(*cmd, timeout_s=10)
        except SlurmCommandError:
            return None
        words = done.stdout.split()
        if done.returncode == 0 and words:
            return words[0]
    return None


def end_time(job_id: str) -> float | None:
    """The job's scheduled end (unix), from squeue, else scontrol; None if unknown."""
    try:
        out = run("squeue", "-h", "-j", job_id, "-o", "%e", timeout_s=15).stdout
        end = parse_time(out.splitlines()[0]) if out.strip() else None
        if end is not None:
            return end
        records = show_job(job_id, timeout_s=15)
    except SlurmCommandError as exc:
        log.warning("could not read the end time of job %s: %s", job_id, exc)
        return None
    return records[0].end_time if records else None


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


def attempts(job_id: str) -> list[Attempt]:
    """Every attempt of the job that accounting recorded ([] when sacct cannot say)."""
    fields = "State,NodeList,Start,End"
    try:
        return parse_attempts(
            run("sacct", "-n", "-D", "-X", "-P", "-j", job_id, "-o", fields).stdout
        )
    except SlurmCommandError:
        return []


# ---- job control ----


class SbatchRejected(SlurmCommandError):
    """sbatch refused the job; the message is what it said, on one line."""


def sbatch(script: str, timeout_s: float = 120.0) -> str:
    """Submit a batch script (its path); the job id. SbatchRejected with what sbatch said
    (every line, without its 'sbatch: error:' prefix) when it refused the job."""
    done = run("sbatch", script, timeout_s=timeout_s)
    if done.returncode != 0:
        lines = [
            line.strip().removeprefix("sbatch: error:").strip() for line in done.stderr.splitlines()
        ]
        raise SbatchRejected("; ".join(line for line in lines if line) or first_line(done))
    m = re.search(r"job (\d+)", done.stdout)
    if m is None:
        raise SlurmCommandError(f"sbatch: no job id in its answer {done.stdout.strip()!r}")
    return m.group(1)


# slurmd refuses a batch job whose credential is not newer, to the second, than the
# revocation of the attempt it just killed ("Job credential revoked", seen on the dev cluster
# when StartTime=now put a requeued job back on one of its nodes within the same second):
# Slurm's own ~120 s hold avoids it; a requeue that starts the job at once waits this long.
RESTART_AFTER_KILL_S = 2.0


def requeue_job(job_id: str) -> None:
    """`scontrol requeue`; SlurmCommandError (one line: what scontrol said) when it failed."""
    run("scontrol", "requeue", job_id, check=True, outlive_term=True)


def requeue(job_id: str, exclude: list[str] | None = None) -> bool:
    """`scontrol requeue` the job, then make it eligible now (Slurm otherwise delays a
    requeued job's start by its AuthInfo cred_expire, 120 s by default), with `exclude` as
    its ExcNodeList when given (Slurm takes it only while the job is pending). Returns
    whether the requeue itself succeeded.

    Asked from inside the job, the requeue takes effect only once every process of the job
    has ended, and Slurm sets the hold then, over any StartTime sent before: such a job waits
    out the hold unless a launcher that follows it from outside sends the update (it does)."""
    try:
        requeue_job(job_id)
    except SlurmCommandError as exc:
        log.error("scontrol requeue %s failed: %s", job_id, exc)
        return False
    start_requeued(job_id, exclude, tries=5)
    return True


def start_requeued(job_id: str, exclude: list[str] | None = None, tries: int = 6) -> bool:
    """Make a job Slurm just requeued (by us, or after its attempt ended) eligible now, with
    `exclude` as its ExcNodeList, no sooner than RESTART_AFTER_KILL_S after the kill."""
    time.sleep(RESTART_AFTER_KILL_S)
    return update_pending(job_id, exclude, start_now=True, tries=tries)


def update_pending(
    job_id: str, exclude: list[str] | None = None, start_now: bool = True, tries: int = 6
) -> bool:
    """`scontrol update JobId=… [ExcNodeList=…] [StartTime=now]` on the pending job, retried
    (a requeued job is completing for a moment). Whether it took."""
    args = ["scontrol", "update", f"JobId={job_id}"]
    if exclude:
        args.append(f"ExcNodeList={','.join(exclude)}")
    if start_now:
        args.append("StartTime=now")
    done = None
    for attempt in range(tries):
        try:
            done = run(*args, outlive_term=True)
        except SlurmCommandError as exc:
            log.warning("%s failed: %s", " ".join(args), exc)
            return False
        if done.returncode == 0:
            return True
        if attempt + 1 < tries:
            time.sleep(1.0 + attempt)
    log.warning("%s failed: %s", " ".join(args), done.stderr.strip() if done else "")
    return False


def cancel(job_id: str) -> None:
    """`scancel`, best effort (the job may have ended meanwhile)."""
    try:
        run("scancel", job_id)
    except SlurmCommandError as exc:
        log.warning("scancel %s: %s", job_id, exc)


# ---- accounting for the report ----

SACCT_TIMEOUT_S = 15.0
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


def sacct_summary(job_id: str) -> tuple[dict[str, Any] | None, str]:
    """Accounting of a job for the report: ({'jobs': [...]} or None, a note saying what
    happened). `sacct --json`, else (Slurm < 21.08, no JSON plugin) the parsable form."""
    if not job_id or not job_id.split("_")[0].isdigit():
        return None, f"job id {job_id!r} is not a Slurm job: accounting skipped"
    if shutil.which("sacct") is None:
        return None, "sacct not found on PATH: Slurm accounting skipped"
    try:
        as_json = run("sacct", "-j", job_id, "--json", timeout_s=SACCT_TIMEOUT_S)
        jobs = parse_sacct_json(as_json.stdout) if as_json.returncode == 0 else None
        form = "sacct"
        if jobs is None:
            fields = ",".join(PARSABLE_FIELDS)
            done = run("sacct", "-j", job_id, "-X", "-P", "-n", "-o", fields,
                       timeout_s=SACCT_TIMEOUT_S)  # fmt: skip
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or as_json.stderr.strip().splitlines()
                       or ["?"])[0]  # fmt: skip
                return None, f"sacct exited {done.returncode} ({why[:200]}): accounting skipped"
            jobs, form = parse_sacct_parsable(done.stdout), "sacct (parsable)"
    except SlurmCommandError as exc:
        return None, f"sacct failed: {exc}: accounting skipped"
    if not jobs:
        return None, f"sacct knows no job {job_id}"
    return {"jobs": jobs}, f"{form}: {len(jobs)} record(s) for job {job_id}"
