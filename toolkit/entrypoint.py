"""What every rank runs: `python -m toolkit.entrypoint RUN_DIR`.

Reads the resolved config the launcher wrote into RUN_DIR, discovers its place in the job
from the environment, joins the process group, runs the task (toolkit.tasks), cleans up.
It knows nothing of the launcher: a batch script prepares RUN_DIR with
`python -m toolkit.launch --compose`. A rank that fails
logs its traceback (to stderr and RUN_DIR/logs/error-rank<k>.txt) and exits 1 at once, so the
executor can end the job instead of leaving other ranks waiting in a collective.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from toolkit import descendants
from toolkit.errors import UserError

# What this rank leaves running when it ends gets this long after SIGTERM (launch.kill_grace_s).
_grace_s = [5.0]


def setup_logging(rank: int, run_dir: Path) -> None:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(
        f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
    )
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    file = logging.FileHandler(logs / f"rank{rank}.log")
    file.setFormatter(fmt)
    root.addHandler(console)
    root.addHandler(file)


def fail_with_one_line(
    exc: UserError, rank: int, run_dir: Path, log: logging.Logger, every_rank: bool = False
) -> None:
    """Every rank raises the same UserError (the condition is agreed or computed alike on
    all of them): rank 0 says it in one line on stderr; each rank keeps it in its log.
    `every_rank`: a condition of this rank alone (out of memory), said on its own stderr."""
    line = f"error: {exc}"
    if rank == 0 or every_rank:
        print(line, file=sys.stderr, flush=True)
    try:
        log.info("rank %d stops: %s", rank, exc)  # the file handler keeps it; no traceback
        (run_dir / "logs" / f"error-rank{rank}.txt").write_text(line + "\n")
    finally:
        logging.shutdown()
    descendants.kill_now()  # its DataLoader workers, a script's children: not left behind
    os._exit(exc.exit_code)


def hold_run_dir(run_dir: Path) -> None:
    """Rank 0 of a Slurm attempt holds RUN_DIR/.lock (toolkit.executors.rundir_lock)."""
    from toolkit.errors import EXIT_RUN_DIR_BUSY
    from toolkit.executors.rundir_lock import RunDirBusy, hold_for_attempt

    try:
        hold_for_attempt(run_dir, dict(os.environ))
    except RunDirBusy as exc:
        raise UserError(str(exc), EXIT_RUN_DIR_BUSY) from None


def out_of_memory(exc: BaseException, job: Any, env: Any) -> UserError | None:
    """A training rank out of memory, as one line (toolkit.train.out_of_memory); None for any
    other failure, or where the job is a script of yours (its own traceback says more)."""
    from toolkit.errors import EXIT_OUT_OF_MEMORY
    from toolkit.train.out_of_memory import is_out_of_memory, out_of_memory_line

    if job is None or job.script.enabled or not is_out_of_memory(exc):
        return None
    line = out_of_memory_line(exc, job, env.rank, env.local_world_size)
    return UserError(line, EXIT_OUT_OF_MEMORY)


def mark_bad_node(run_dir: Path, text: str) -> None:
    """A hardware error (uncorrectable ECC, XID, ...) marks this rank's node as bad, for
    the requeue to leave out (toolkit.executors.badnodes)."""
    try:
        from toolkit.distributed.env import restart_count
        from toolkit.executors.badnodes import note_rank_failure

        note_rank_failure(run_dir, text, restart_count())
    except Exception:  # noqa: BLE001, S110 - the rank is failing already: its error comes first
        pass


def run_rank(run_dir: Path) -> int:
    from toolkit.config.compose import load_job
    from toolkit.distributed.env import discover
    from toolkit.distributed.init import init_distributed, shutdown_distributed
    from toolkit.runinfo import write_snapshot
    from toolkit.tasks import OWN_PROCESS_GROUP, resolve_task, task_of

    env = discover()
    job = None
    setup_logging(env.rank, run_dir)
    descendants.become_subreaper()  # orphans below this rank stay below it, to be ended
    log = logging.getLogger("toolkit.entrypoint")
    from toolkit.fault.hang import install_stack_dump, remove_stack_dump

    install_stack_dump(run_dir, env.rank)  # the hang watchdog's evidence: stacks on a signal
    try:
        job = load_job(run_dir / "config.yaml")
        _grace_s[0] = job.launch.kill_grace_s
        descendants.end_with_parent(job.launch.kill_grace_s)
        from toolkit.executors import log_cap

        log_cap.watch(run_dir, job.launch.max_log_bytes)  # stdout/stderr files: capped
        if job.trainer.deterministic:  # before CUDA starts: cuBLAS reads its setting once
            from toolkit.distributed.determinism import enable_deterministic

            enable_deterministic(env.is_rank0)
        from toolkit.nccl import configure  # NCCL/PyTorch variables, checked against the node

        configure(job.nccl, env, run_dir, deterministic=job.trainer.deterministic)
        if env.is_rank0 and env.source == "slurm":  # one writer per run dir, per attempt
            hold_run_dir(run_dir)
        task = task_of(job)
        # Your own script joins its own process group (a second one in this process fails).
        device = None if task in OWN_PROCESS_GROUP else init_distributed(env, job.nccl.timeout_s)
        if env.is_rank0:
            write_snapshot(run_dir / "env.json")
            log.info(
                "world %d (%s), device %s, run dir %s", env.world_size, env.source, device, run_dir
            )
        result = resolve_task(task)(job, env, run_dir, device)
    except UserError as exc:  # the user can act on it: one line from rank 0, no traceback
        fail_with_one_line(exc, env.rank, run_dir, log)
    except BaseException as exc:  # noqa: BLE001 - every failure must surface with its rank
        said = out_of_memory(exc, job, env)
        if said is not None:
            fail_with_one_line(said, env.rank, run_dir, log, every_rank=True)
        text = traceback.format_exc()
        log.error("rank %d failed: %s: %s\n%s", env.rank, type(exc).__name__, exc, text)
        try:
            (run_dir / "logs" / f"error-rank{env.rank}.txt").write_text(text)
            mark_bad_node(run_dir, text)
        finally:
            logging.shutdown()
            descendants.kill_now()
        code = (
            exc.code
            if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code
            else 1
        )
        os._exit(code)  # do not wait for peers or background threads
    shutdown_distributed()
    remove_stack_dump()
    # A task may ask for a distinct exit code (e.g. 75: checkpointed after a signal).
    return int(result.get("exit_code", 0)) if isinstance(result, dict) else 0


def exit_without_teardown(code: int) -> None:
    """End the rank as the interpreter would, less its last phase: threading's own shutdown
    (its exit hooks, e.g. ThreadPoolExecutor's, then a join of every thread that is not a
    daemon), the atexit handlers (multiprocessing's, a tracker's), the logs and the standard
    streams flushed, then `os._exit`. The phase left out, tearing down every module and
    collecting torch's objects one by one, took 1.2-3.2 s per launch after the rank's work
    was done and its files were closed (docs/BENCHMARKS.md, "Issue 37 — a rank's exit").
    `threading._shutdown` and `atexit._run_exitfuncs` are CPython's own (what its
    finalisation calls, in that order); where either is missing the rank exits the ordinary
    way. Last, what the rank leaves running below it (a script's daemons, a worker pool) is
    ended: SIGTERM, SIGKILL after launch.kill_grace_s."""
    shutdown_threads = getattr(threading, "_shutdown", None)
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if not (callable(shutdown_threads) and callable(run_exitfuncs)):
        descendants.end(_grace_s[0])
        sys.exit(code)
    shutdown_threads()
    run_exitfuncs()
    descendants.end(_grace_s[0])
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m toolkit.entrypoint RUN_DIR", file=sys.stderr)
        return 2
    return run_rank(Path(args[0]).resolve())


if __name__ == "__main__":
    exit_without_teardown(main())
