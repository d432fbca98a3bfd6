"""Every call of Slurm's commands (scontrol, sacct, squeue, sinfo, sacctmgr, sbatch,
scancel), in one place; their answers are read by toolkit.slurm_records (typed records).

One wrapper (`run`) starts them all, under a time limit; a command that is missing, times
out or (when asked to be checked) exits non-zero raises `SlurmCommandError`, one line.
Decisions (what a state means for the launcher, when to requeue, which node to leave out)
live with their callers in toolkit.executors; this module and slurm_records sit at the
bottom and import nothing else of the toolkit, so the launcher, the in-job hooks, the report,
the CLI and the nodelist expansion of toolkit.distributed all use them.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from toolkit.slurm_records import (
    PARSABLE_FIELDS,
    Attempt,
    JobRecord,
    JobState,
    NodeEvent,
    parse_attempts,
    parse_node_events,
    parse_sacct_json,
    parse_sacct_parsable,
    parse_sacct_states,
    parse_show_job,
    parse_sinfo_nodes,
    parse_time,
    states_of,
)

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0


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


def node_events(nodes: list[str], start: str) -> list[NodeEvent]:
    """Accounting's node events of `nodes` since `start` ([] when sacctmgr cannot say)."""
    try:
        out = run("sacctmgr", "-n", "-P", "show", "event", f"Nodes={','.join(nodes)}",
                  f"Start={start}", "format=NodeName,State,Reason,TimeStart").stdout  # fmt: skip
    except SlurmCommandError:
        return []
    return parse_node_events(out)


# ---- jobs ----


def show_job(job_id: str, timeout_s: float = TIMEOUT_S) -> list[JobRecord] | None:
    """The job's records while slurmctld knows it; None once it was purged (MinJobAge) or
    never existed. SlurmCommandError when scontrol cannot be asked."""
    done = run("scontrol", "show", "job", "-o", job_id, timeout_s=timeout_s)
    return parse_show_job(done.stdout) if done.returncode == 0 else None


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
