"""Ranks as local processes, supervised: one failing rank ends the job within seconds.

Environment per rank is torchrun-style (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...).
Rank 0 writes to this terminal; every other rank to RUN_DIR/logs/rank<k>.{out,err}.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from toolkit import descendants
from toolkit.config.shape import local_gpu_count, tasks_per_node
from toolkit.distributed.env import free_port
from toolkit.errors import EXIT_HANG, EXIT_OUT_OF_MEMORY, USER_ERROR_EXITS
from toolkit.executors import PreparedRun, repo_root, rundir_lock
from toolkit.executors.rank_start import Rank, RankServer, use_fork
from toolkit.fault.hang import hang_summaries
from toolkit.redact import redact, redact_text

POLL_S = 0.1


def rank_env(
    rank: int, world: int, port: int, run_dir: Path, cpus_per_task: int | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    if cpus_per_task:
        env["TOOLKIT_CPUS_PER_TASK"] = str(cpus_per_task)  # intra-op threads per rank
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TOOLKIT_JOB_ID=f"local-{os.getpid()}",
        PYTHONPATH=os.pathsep.join(p for p in (str(repo_root()), env.get("PYTHONPATH")) if p),
        PYTHONUNBUFFERED="1",
    )
    return env


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with(launcher_pid: int):
    """A preexec_fn for a rank: SIGTERM it when its launcher dies, however (Linux's
    PR_SET_PDEATHSIG), which the rank takes as a preemption: it checkpoints at the next step
    and ends, instead of running on unsupervised. Elsewhere a no-op."""

    def arm() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        except (OSError, AttributeError):
            return
        if os.getppid() != launcher_pid:  # it died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def failed_at(logs: Path, rank: int) -> float:
    """When the rank wrote its error; -inf when it wrote none (killed, or exited without a
    Python error), so a rank that died outright counts as the first. A file left by an
    earlier launch is older than any written in this one, so it sorts the same way."""
    try:
        return (logs / f"error-rank{rank}.txt").stat().st_mtime
    except OSError:
        return -math.inf


def interrupted_line(run_dir: Path, cut_off: bool) -> str:
    """What an interrupted run left: whether a save was cut off, the newest commit."""
    from toolkit.checkpoint.layout import MANIFEST

    committed = sorted(
        p for p in (run_dir / "checkpoints").glob("step-*") if (p / MANIFEST).is_file()
    )
    newest = f"newest committed checkpoint {committed[-1]}" if committed else "no checkpoint"
    cut = "; ranks still running after launch.kill_grace_s were killed" if cut_off else ""
    return f"interrupted: all ranks stopped{cut}; {newest}; relaunch into {run_dir} to resume"


def send_hangs_to_trackers(run: PreparedRun) -> None:
    """The hang that ended this local run, to the run's trackers (tracking=...), once."""
    if not run.job.tracking.backends:
        return
    from toolkit.config.compose import job_to_dict
    from toolkit.tracking.build import send_final_hangs

    try:
        send_final_hangs(run.job.tracking, run.run_dir, job_to_dict(run.job))
    except Exception as exc:  # noqa: BLE001 - the hang is said; the trackers are extra
        print(f"tracking: the hang was not sent to the trackers: {exc}", file=sys.stderr)


class LocalExecutor:
    def run(self, runs: list[PreparedRun]) -> int:
        worst = 0
        for i, run in enumerate(runs):
            if len(runs) > 1:
                print(
                    f"[{i + 1}/{len(runs)}] {' '.join(redact(run.overrides))} -> {run.run_dir}",
                    flush=True,
                )
            if run.job.launch.dry_run:
                print(self.describe(run))
                continue
            if run.job.launch.detach:
                worst = max(worst, self.detach(run))
                continue
            code = self.run_one(run)
            if len(runs) > 1:
                print(
                    f"[{i + 1}/{len(runs)}] {'ok' if code == 0 else f'FAILED (exit {code})'}",
                    flush=True,
                )
            worst = max(worst, code)
        return worst

    def describe(self, run: PreparedRun) -> str:
        n = tasks_per_node(run.job.cluster)
        said = f"would start {n} local ranks: {sys.executable} -m toolkit.entrypoint {run.run_dir}"
        if run.job.script.enabled:
            said += f"\n  each running {redact_text(run.job.script.command_line())}"
        return said

    def detach(self, run: PreparedRun) -> int:
        """Hand the supervision to a background process of its own and return."""
        logs = run.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        lock_fd = rundir_lock.held_fd(run.run_dir)  # the supervisor and its ranks hold it on
        handed = {rundir_lock.ENV_FD: str(lock_fd)} if lock_fd is not None else {}
        with open(logs / "supervisor.out", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "toolkit.executors.local", str(run.run_dir)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=rank_env(0, 1, 0, run.run_dir) | {"RANK": "", "WORLD_SIZE": ""} | handed,
                pass_fds=() if lock_fd is None else (lock_fd,),
            )
        print(f"detached: supervisor pid {proc.pid}; logs in {logs}", flush=True)
        return 0

    def run_one(self, run: PreparedRun, follow: bool | None = None) -> int:
        job = run.job
        follow = job.launch.follow if follow is None else follow
        world = tasks_per_node(job.cluster)
        port = job.cluster.master_port or free_port()
        logs = run.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        lock_fd = rundir_lock.held_fd(run.run_dir)
        # What the ranks leave behind (a killed rank's DataLoader workers, a script's daemons)
        # comes here, not to init, and is ended with the job; what ran here before is kept.
        descendants.become_subreaper()
        before = descendants.below()
        server = (
            RankServer(
                rank_env(0, world, port, run.run_dir),
                logs / "rank_server.log",
                "script" if job.script.enabled else "train",
            )
            if use_fork(job.launch.rank_start, local_gpu_count())
            else None
        )
        started = time.time()
        try:
            procs = [
                self._start_rank(run, rank, world, port, lock_fd, server, follow)
                for rank in range(world)
            ]
            return self._follow(run, procs, follow, started)
        finally:
            if server is not None:
                server.close()
            descendants.end(job.launch.kill_grace_s, keep=before)

    def _follow(self, run: PreparedRun, procs: list[Rank], follow: bool, started: float) -> int:
        """Supervise the ranks to their end; say how the run ended."""
        job, logs = run.job, run.run_dir / "logs"
        # Ctrl-C stops the ranks at their next step even where SIGINT came in ignored (a
        # command started with `&` from a script): the ranks handle it themselves anyway.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
        try:
            code, failed = self._supervise(procs, job.launch.kill_grace_s, logs)
        except KeyboardInterrupt:
            print(
                "interrupted: the ranks stop at their next step and checkpoint "
                "(Ctrl-C again to kill them)",
                file=sys.stderr,
                flush=True,
            )
            try:
                cut_off = self._terminate(procs, job.launch.kill_grace_s)
            except KeyboardInterrupt:
                cut_off = self._terminate(procs, 0.0)
            print(interrupted_line(run.run_dir, cut_off), file=sys.stderr)
            return 130
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        hangs = hang_summaries(run.run_dir, since_unix=started) if failed is not None else []
        if hangs:
            # The node agent's watchdog ended the ranks after dumping their stacks.
            print(hangs[-1][1]["message"], file=sys.stderr, flush=True)
            send_hangs_to_trackers(run)  # no next attempt here to send it
            return EXIT_HANG
        if failed is not None and code in USER_ERROR_EXITS:
            # Every rank says the same line, rank 0 on this terminal when followed; out of
            # memory is one rank's own, said by that rank.
            sayer = failed if code == EXIT_OUT_OF_MEMORY else 0
            if not (follow and sayer == 0 and (logs / "error-rank0.txt").exists()):
                said = tail(logs / f"error-rank{sayer}.txt") or tail(
                    logs / f"error-rank{failed}.txt"
                )
                print(said.strip(), file=sys.stderr)
        elif failed is not None:
            report = tail(logs / f"error-rank{failed}.txt") or tail(logs / f"rank{failed}.err")
            print(
                f"rank {failed} failed with exit code {code}; the job was stopped.", file=sys.stderr
            )
            if report:
                print(f"--- rank {failed} (tail) ---\n{report}", file=sys.stderr)
        return code

    @staticmethod
    def _start_rank(
        run: PreparedRun,
        rank: int,
        world: int,
        port: int,
        lock_fd: int | None,
        server: RankServer | None,
        follow: bool,
    ) -> Rank:
        """One rank, with the environment torchrun gives it, forked by `server` or started
        in a fresh interpreter; rank 0 on this terminal when followed, the others (and rank 0
        otherwise) into RUN_DIR/logs/rank<k>.{out,err}. Every rank holds the run dir's lock
        too: it is free only when the last one ends."""
        logs = run.run_dir / "logs"
        env = rank_env(rank, world, port, run.run_dir, run.job.cluster.cpus_per_task)
        with contextlib.ExitStack() as files:
            if rank == 0 and follow:
                streams = None, None
            else:
                streams = tuple(
                    files.enter_context(open(logs / f"rank{rank}.{kind}", "ab"))  # noqa: SIM115
                    for kind in ("out", "err")
                )
            if server is not None:  # descriptors 1 and 2: this process's own streams
                fds = [1 if streams[0] is None else streams[0].fileno()]
                fds.append(2 if streams[1] is None else streams[1].fileno())
                return server.fork(run.run_dir, env, fds[0], fds[1], lock_fd)
            return subprocess.Popen(
                [sys.executable, "-m", "toolkit.entrypoint", str(run.run_dir)],
                env=env,
                stdout=streams[0],
                stderr=streams[1],
                stdin=subprocess.DEVNULL,
                pass_fds=() if lock_fd is None else (lock_fd,),
                preexec_fn=end_with(os.getpid()),
            )

    def _supervise(self, procs: list[Rank], grace_s: float, logs: Path) -> tuple[int, int | None]:
        while True:
            codes = [p.poll() for p in procs]
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                # Ranks that died between two polls: the first to fail is the cause (the
                # others mostly report the broken collective), told by when each wrote its error.
                rank = min(failed, key=lambda r: failed_at(logs, r))
                code = codes[rank]
                self._terminate(procs, grace_s)
                return (code if code > 0 else 128 - code), rank
            if None not in codes:
                return 0, None
            time.sleep(POLL_S)

    @staticmethod
    def _terminate(procs: list[Rank], grace_s: float) -> bool:
        """SIGTERM the ranks, SIGKILL those still running after grace_s; whether any was."""
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + grace_s
        killed = False
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                killed = True
        return killed


def main(argv: list[str] | None = None) -> int:
    """Detached supervision: `python -m toolkit.executors.local RUN_DIR`."""
    from toolkit.config.compose import load_job

    run_dir = Path((argv or sys.argv[1:])[0]).resolve()
    rundir_lock.adopt(run_dir, dict(os.environ))
    job = load_job(run_dir / "config.yaml")
    return LocalExecutor().run_one(PreparedRun(job, run_dir, []), follow=False)


if __name__ == "__main__":
    sys.exit(main())
