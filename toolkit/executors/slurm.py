"""Runs on Slurm through submitit: one job per run, or one job array for a sweep.

Every task runs `python -u -m toolkit.entrypoint RUN_DIR` under a single `srun` with
`--kill-on-bad-exit=1`, so a failing rank ends the whole step within seconds. The launcher
prints the job id, run dir and log paths, follows rank 0's output until the job ends and
exits with the job's status (the tail of the failing rank's stderr when it failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from toolkit.config.shape import tasks_per_node
from toolkit.errors import EXIT_HANG, USER_ERROR_EXITS
from toolkit.executors import PreparedRun, repo_root, rundir_lock
from toolkit.executors.requeue import RequeuePolicy
from toolkit.executors.slurm_exclude import RequeueWatch
from toolkit.executors.slurm_jobs import failed_task, unreachable_reason
from toolkit.executors.slurm_sbatch import Submission, log_path, plan
from toolkit.fault.hang import hang_summaries
from toolkit.redact import redact
from toolkit.slurm_cli import (
    SbatchRejected,
    SlurmCommandError,
    cancel,
    job_states,
    sbatch,
)
from toolkit.slurm_records import JobState

POLL_S = 0.5
ACCOUNTING_TRIES = 20  # polls for an array element's state in accounting after slurmctld's
TAIL_LINES = 20


class SlurmExecutor:
    def run(self, runs: list[PreparedRun]) -> int:
        cluster, launch = runs[0].job.cluster, runs[0].job.launch
        submission = plan(cluster, [r.run_dir for r in runs], repo_root())
        if launch.dry_run:
            print(submission.script(), end="")
            return 0
        reason = unreachable_reason()
        if reason:
            print(f"error: {reason}", file=sys.stderr)
            return 1
        try:
            job_ids = submit(submission, runs)
        except SbatchRejected as exc:
            print(f"error: sbatch rejected the job: {exc}", file=sys.stderr)
            return 1
        except SlurmCommandError as exc:
            print(f"error: could not submit the job: {exc}", file=sys.stderr)
            return 1
        describe(submission, runs, job_ids, tasks_per_node(cluster))
        if launch.detach:
            return 0
        try:
            return self._follow(submission, runs, job_ids)
        except NeverRuns as exc:
            cancel(exc.job_id.split("_")[0])
            print(
                f"error: Slurm accepted job {exc.job_id} but it can never run as requested "
                f"(pending reason {exc.reason}); cancelled it",
                file=sys.stderr,
            )
            return 1

    @staticmethod
    def _follow(submission: Submission, runs: list[PreparedRun], job_ids: list[str]) -> int:
        launch = runs[0].job.launch
        try:
            if len(runs) == 1:
                watch = requeue_watch(runs[0].job, runs[0].run_dir, job_ids[0])
                return follow_job(
                    submission.folder, job_ids[0], runs[0].run_dir, launch.follow, watch
                )
            return follow_array(submission.folder, job_ids, runs)
        except KeyboardInterrupt:
            print(
                f"\nstopped following; the job keeps running (scancel {job_ids[0].split('_')[0]} "
                "to stop it)",
                file=sys.stderr,
            )
            return 130


def submit(submission: Submission, runs: list[PreparedRun]) -> list[str]:
    """Write submitit's sbatch script and submit it (one sbatch call); return the job ids
    ('120_0', ... for arrays). The script is the one `launch.dry_run` prints."""
    # The sbatch script holds the setup lines verbatim (Slurm executes them): user-only.
    submission.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    submission.folder.chmod(0o700)
    if len(runs) > 1:
        links = submission.folder / "runs"
        links.mkdir(exist_ok=True)
        for index, run in enumerate(runs):
            link = links / str(index)
            if link.is_symlink():
                link.unlink()
            link.symlink_to(run.run_dir, target_is_directory=True)
    pending = submission.folder / f".submission_file_{os.getpid()}.sh"
    pending.write_text(submission.script())
    job_id = sbatch(str(pending))
    script = submission.folder / f"{job_id}_submission.sh"  # where submitit kept it
    pending.replace(script)
    job_ids = [f"{job_id}_{i}" for i in range(len(runs))] if len(runs) > 1 else [job_id]
    for index, (run, job_id) in enumerate(zip(runs, job_ids, strict=True)):
        record = {
            "job_id": job_id,
            "array_index": index if len(runs) > 1 else None,
            "slurm_folder": str(submission.folder),
            "sbatch_script": str(script),
        }
        (run.run_dir / "slurm.json").write_text(json.dumps(record, indent=2) + "\n")
        rundir_lock.record_slurm(run.run_dir, job_id)  # the job holds the run dir now
    return job_ids


def describe(submission: Submission, runs: list[PreparedRun], job_ids: list[str], tasks: int):
    cluster = runs[0].job.cluster
    shape = f"{cluster.nodes} node(s) x {tasks} task(s)"
    if len(runs) == 1:
        print(f"submitted Slurm job {job_ids[0]} ({shape})", flush=True)
        print(f"  run dir: {runs[0].run_dir}")
        print(f"  rank 0:  {log_path(submission.folder, job_ids[0], 0, 'out')} (.err)")
        print(f"  rank k:  {log_path(submission.folder, job_ids[0], '<rank>', 'out')}", flush=True)
        return
    array_id = job_ids[0].split("_")[0]
    print(f"submitted Slurm job array {array_id}: {len(runs)} elements ({shape} each)")
    for run, job_id in zip(runs, job_ids, strict=True):
        print(f"  {job_id}: {' '.join(redact(run.overrides))} -> {run.run_dir}")
    print(f"  logs: {submission.folder}/<job>_<rank>_log.out|err", flush=True)


class NeverRuns(Exception):
    def __init__(self, job_id: str, reason: str):
        super().__init__(f"{job_id}: {reason}")
        self.job_id, self.reason = job_id, reason


class _Tail:
    """Copies what is appended to a file onto a stream; starts over when the file was
    written anew (a requeued job's log): shorter than what was read, or another beginning."""

    HEAD_BYTES = 256

    def __init__(self, path: Path, stream: TextIO):
        self.path, self.stream, self.offset, self.head = path, stream, 0, b""

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                start = f.read(self.HEAD_BYTES)
                if not start.startswith(self.head[: len(start)]) or (
                    os.fstat(f.fileno()).st_size < self.offset
                ):
                    self.offset, self.head = 0, b""
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if data:
            if len(self.head) < self.HEAD_BYTES:
                self.head = start
            self.offset += len(data)
            self.stream.write(data.decode(errors="replace"))
            self.stream.flush()


def wait(job_id: str, on_poll=None) -> dict[str, JobState]:
    """Poll until the job (every element of an array) reached a final state."""
    while True:
        states = job_states(job_id)
        if on_poll is not None:
            on_poll(states)
        if states and all(s.final for s in states.values()):
            return states
        for name, state in states.items():
            if state.never_runs:
                raise NeverRuns(name, state.reason)
        time.sleep(POLL_S)


def requeue_watch(job: Any, run_dir: Path, job_id: str) -> RequeueWatch:
    """What the launcher does about bad nodes while it follows the job (slurm_exclude)."""
    return RequeueWatch(run_dir, job_id, RequeuePolicy.of(job))


def follow_job(
    folder: Path, job_id: str, run_dir: Path, follow: bool, watch: RequeueWatch | None = None
) -> int:
    tails = (
        [
            _Tail(log_path(folder, job_id, 0, "out"), sys.stdout),
            _Tail(log_path(folder, job_id, 0, "err"), sys.stderr),
        ]
        if follow
        else []
    )
    restarts = [0]

    def on_poll(states: dict[str, JobState]) -> None:
        state = states.get(job_id)
        if state is not None and state.restarts > restarts[0]:
            restarts[0] = state.restarts
            print(
                f"job {job_id} requeued (restart {state.restarts}); following it until it ends",
                flush=True,
            )
        if state is not None and watch is not None:
            watch.on_state(state.state, state.restarts)
        for t in tails:
            t.pump()

    while True:
        state = wait(job_id, on_poll=on_poll)[job_id]
        failed = state.state == "FAILED" and watch is not None and watch.stopped is None
        if not (failed and watch.after_failure(state.restarts)):
            break
    for t in tails:
        t.pump()
    if watch is not None and watch.stopped is not None:
        print(f"error: job {job_id}: {watch.stopped.message}", file=sys.stderr, flush=True)
    code = state.exit_status()
    hang = last_hang(run_dir, state.restarts) if code != 0 else None
    if hang is not None:
        print(hang, file=sys.stderr, flush=True)  # the watchdog ended it after the dumps
        return EXIT_HANG
    if code == 0:
        print(f"job {job_id} COMPLETED; run dir {run_dir}", flush=True)
    elif code in USER_ERROR_EXITS:
        # Rank 0 said what and what to do in one line; followed, it is on stderr already.
        if not follow:
            print(_tail(run_dir / "logs" / "error-rank0.txt", 1), file=sys.stderr, flush=True)
    else:
        report_failure(folder, job_id, run_dir, state)
    return code


def follow_array(folder: Path, job_ids: list[str], runs: list[PreparedRun]) -> int:
    seen: dict[str, str] = {}

    def progress(states: dict[str, JobState]) -> None:
        for job_id in job_ids:
            state = states.get(job_id)
            if state is not None and seen.get(job_id) != state.state:
                seen[job_id] = state.state
                print(f"  {job_id}: {state.state}", flush=True)

    states = wait(job_ids[0].split("_")[0], on_poll=progress)
    for _ in range(ACCOUNTING_TRIES):  # elements slurmctld purged (MinJobAge) before the end
        missing = [job_id for job_id in job_ids if job_id not in states]
        if not missing:
            break
        for job_id in missing:  # from accounting now
            states.update(job_states(job_id))
        time.sleep(POLL_S)
    for job_id in job_ids:  # neither slurmctld nor accounting knows it: said, not a KeyError
        states.setdefault(job_id, JobState("UNKNOWN", 0, 0, "not in slurmctld or accounting"))
    worst = 0
    print("sweep results:")
    for index, (run, job_id) in enumerate(zip(runs, job_ids, strict=True)):
        state = states[job_id]
        code = state.exit_status()
        outcome = "ok" if code == 0 else f"{state.state} (exit {code})"
        print(f"  [{index}] {job_id} {outcome}: {' '.join(redact(run.overrides))} -> {run.run_dir}")
        worst = max(worst, code)
    for run, job_id in zip(runs, job_ids, strict=True):
        if states[job_id].exit_status():
            report_failure(folder, job_id, run.run_dir, states[job_id])
    return worst


def last_hang(run_dir: Path, attempt: int) -> str | None:
    """The one line of the hang that ended attempt `attempt` of the job, if one did (a hang
    of an earlier attempt, followed by a requeue, is history)."""
    submitted = 0.0
    with contextlib.suppress(OSError):
        submitted = (run_dir / "slurm.json").stat().st_mtime
    for _, summary in reversed(hang_summaries(run_dir, since_unix=submitted)):
        if summary.get("attempt", attempt) == attempt:
            return str(summary["message"])
    return None


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def failing_rank(folder: Path, job_id: str, run_dir: Path) -> int | None:
    """The rank that failed first: as srun reported it, else the oldest error-rank<k>.txt
    (peers of a failed rank often fail too, a moment later, in their next collective)."""
    reported = failed_task(_tail(log_path(folder, job_id, 0, "err"), 200))
    if reported is not None:
        return reported
    errors = [
        (p.stat().st_mtime, int(p.stem.removeprefix("error-rank")))
        for p in (run_dir / "logs").glob("error-rank*.txt")
        if p.stem.removeprefix("error-rank").isdigit()
    ]
    return min(errors)[1] if errors else None


def report_failure(folder: Path, job_id: str, run_dir: Path, state: JobState) -> None:
    # A cancelled or timed-out job's ranks were stopped by Slurm: no rank is to blame.
    rank = failing_rank(folder, job_id, run_dir) if state.state == "FAILED" else None
    who = f"rank {rank} failed" if rank is not None else "see the logs"
    print(
        f"job {job_id} {state.state} (exit code {state.exit_code}, signal {state.signal}); "
        f"{who}; run dir {run_dir}",
        file=sys.stderr,
    )
    err = log_path(folder, job_id, rank if rank is not None else 0, "err")
    text = _tail(err)
    if text:
        print(f"--- {err} (tail) ---\n{text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Follow a submitted run again: `python -m toolkit.executors.slurm RUN_DIR`."""
    run_dir = Path((argv or sys.argv[1:])[0]).resolve()
    record = json.loads((run_dir / "slurm.json").read_text())
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    from toolkit.config.compose import load_job

    watch = requeue_watch(load_job(run_dir / "config.yaml"), run_dir, record["job_id"])
    return follow_job(Path(record["slurm_folder"]), record["job_id"], run_dir, True, watch)


if __name__ == "__main__":
    sys.exit(main())
