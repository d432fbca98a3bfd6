"""One writer per run directory: RUN_DIR/.lock.

A local run holds an exclusive `flock` on RUN_DIR/.lock from before the launcher writes
config.yaml until its last rank ends: the launcher takes it and every rank (and a detached
supervisor) inherits the open file, so the kernel releases it when the last of them dies,
crash or not: there is never a stale lock to remove by hand. The file says who holds it
(JSON {pid, host, slurm_job_id}, mode 0600) so that a refused launch can name the holder.

A Slurm job outlives its launcher and is requeued on other nodes, so there the lock is the
job itself: the launcher (or the batch script's `--compose`) records the job id in the file,
and a later launch into the same run dir is refused while that job is pending or running.
Inside the job, rank 0 of each attempt holds the flock until it ends (`hold_for_attempt`),
so that nothing else writes there while the attempt runs, requeue or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

LOCK_NAME = ".lock"
ENV_FD = "TOOLKIT_RUN_LOCK_FD"  # the inherited lock's descriptor, for a detached supervisor
LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"})
LIVE_STATES |= {"REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED"}

_held: dict[Path, int] = {}  # run dir -> descriptor of the lock this process holds


class RunDirBusy(Exception):
    """Another launch writes into this run dir; the message names it (one line)."""


def holder(run_dir: Path) -> dict:
    """What the lock file says about its holder ({} when absent or unreadable)."""
    try:
        record = json.loads((run_dir / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _busy(run_dir: Path, record: dict) -> RunDirBusy:
    if record.get("slurm_job_id"):
        who = f"Slurm job {record['slurm_job_id']} (submitted from {record.get('host', '?')})"
        stop = f"scancel {record['slurm_job_id']}"
    else:
        who = f"pid {record.get('pid', '?')} on {record.get('host', '?')}"
        stop = "stop it"
    return RunDirBusy(
        f"run dir {run_dir} is in use by {who}; wait for it to end or {stop}, "
        "or launch into another hydra.run.dir"
    )


def _write(fd: int, record: dict) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)


def _open(run_dir: Path) -> int:
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def acquire(
    run_dir: Path,
    job_state: Callable[[str], str | None] | None = None,
    slurm_job_id: str | None = None,
) -> int:
    """Take the run dir's lock for this process (and the children it hands the descriptor
    to); return the descriptor. Raises RunDirBusy naming the holder: a live local holder, or
    (with job_state: Slurm job id -> state, None if gone) another Slurm job still pending or
    running. `slurm_job_id`: the job this process runs in (rank 0 of an attempt), recorded.
    """
    run_dir = Path(run_dir)
    if run_dir in _held:
        return _held[run_dir]
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = _open(run_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _busy(run_dir, holder(run_dir)) from None
    record = holder(run_dir)
    job_id = record.get("slurm_job_id")
    other_job = job_id and str(job_id) != slurm_job_id
    if other_job and job_state is not None and job_state(str(job_id)) in LIVE_STATES:
        os.close(fd)
        raise _busy(run_dir, record)
    _write(fd, {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job_id": slurm_job_id})
    _held[run_dir] = fd
    return fd


def hold_for_attempt(run_dir: Path, environ: dict[str, str]) -> None:
    """Rank 0 of a Slurm attempt: hold the lock for this job until the process ends (the
    kernel releases it then, also when the attempt is killed). Raises RunDirBusy when another
    process or another live job holds the run dir."""
    from toolkit.distributed.env import slurm_job_label  # '123', or '120_3' in an array

    acquire(Path(run_dir), slurm_state, slurm_job_id=slurm_job_label(environ))


def adopt(run_dir: Path, environ: dict[str, str]) -> None:
    """In a detached supervisor: the lock its launcher handed over (ENV_FD) is this run's."""
    if environ.get(ENV_FD):
        _held[Path(run_dir)] = int(environ[ENV_FD])


def held_fd(run_dir: Path) -> int | None:
    """The descriptor of the lock this process holds on run_dir, to pass to its ranks."""
    return _held.get(Path(run_dir))


def release(run_dir: Path) -> None:
    fd = _held.pop(Path(run_dir), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def check_slurm(run_dir: Path, job_state: Callable[[str], str | None]) -> None:
    """Before a Slurm submission: refuse as `acquire` does; once submitted, the job is
    recorded by `record_slurm` and holds the run dir from then on."""
    acquire(run_dir, job_state)
    release(run_dir)


def slurm_state(job_id: str) -> str | None:
    """The job's Slurm state (e.g. PENDING, RUNNING), None when Slurm no longer knows it or
    is not installed here."""
    from toolkit import slurm_cli

    try:
        states = slurm_cli.job_states(job_id)
    except slurm_cli.SlurmCommandError:
        return None
    state = states.get(job_id) or next(iter(states.values()), None)
    return state.state if state is not None else None


def record_slurm(run_dir: Path, job_id: str | None) -> None:
    """After submission: the run dir belongs to job_id until it ends (requeues included)."""
    fd = _open(Path(run_dir))
    try:
        _write(fd, {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job_id": job_id})
    finally:
        os.close(fd)
