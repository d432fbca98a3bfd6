"""How the local launcher starts its ranks: each in a fresh interpreter (`exec`), or forked
from one server process that has already imported torch and the toolkit (`fork`).

A rank's start-up is mostly imports: torch, FSDP/DTensor, dynamo, about 2.5 s of CPU each
(docs/BENCHMARKS.md, "Issue 37 — where a launch goes"). With `fork` they are paid once per
launch: `python -m toolkit.rank_server` imports them, then forks each rank on
request, a copy-on-write child that is what `python -m toolkit.entrypoint RUN_DIR` would be:
the same environment, working directory, standard streams (handed over as descriptors) and
run-dir lock. The server reports each rank's exit status and ends, without a teardown, as
soon as its launcher closes the connection (or dies: the ranks then get SIGTERM, as `exec`
ranks do when their launcher dies).

CUDA cannot be initialised in a process forked from one that touched it, so `fork` is for
CPU ranks: `launch.rank_start=auto` forks only where this machine shows no GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from toolkit.descendants import become_subreaper
from toolkit.errors import UserError

MESSAGE_BYTES = 1 << 20  # a request (the rank's environment) or a report, as JSON


class Rank(Protocol):
    """What the launcher's supervision uses of a rank (subprocess.Popen has it): exit status
    as Popen's, negative when killed by that signal."""

    pid: int

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def use_fork(choice: str, gpus_here: int) -> bool:
    """launch.rank_start resolved: `auto` forks where the ranks run on CPU; `fork` with a GPU
    here is refused, in one line."""
    if choice == "fork" and gpus_here:
        raise UserError(
            f"launch.rank_start=fork: this machine shows {gpus_here} GPU(s), and a rank forked "
            "from a process that loaded torch cannot be trusted to initialise CUDA; use "
            "launch.rank_start=exec (or auto)"
        )
    if choice == "auto":
        return gpus_here == 0 and sys.platform.startswith("linux")
    return choice == "fork"


class ForkedRank:
    def __init__(self, server: RankServer, pid: int):
        self.server = server
        self.pid = pid

    def poll(self) -> int | None:
        code = self.server.exit_codes.get(self.pid)
        if code is None and self.server.gone:
            code = self._orphan_status()
        return code

    def _orphan_status(self) -> int | None:
        """The server was killed: the launcher, a child subreaper, has adopted the rank and
        reaps it; where it could not adopt it, a rank that is gone ended without a status."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                code = 1
            else:
                return None
        else:
            if pid == 0:
                return None
            code = os.waitstatus_to_exitcode(status)
        self.server.exit_codes[self.pid] = code
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            with self.server.ended:
                self.server.ended.wait(0.1)
        return code

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class RankServer:
    """The launcher's side: starts the server (which imports torch, and what ranks of `task`
    import, while the launcher goes on), asks it for ranks, and hears their exit statuses."""

    def __init__(self, env: dict[str, str], log: Path, task: str = "train"):
        # A child subreaper: a rank whose server was killed becomes the launcher's child,
        # to be reaped with its exit status.
        become_subreaper()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "toolkit.rank_server", str(theirs.fileno()), task],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                pass_fds=(theirs.fileno(),),
            )
        theirs.close()
        self.sock = ours
        self.exit_codes: dict[int, int] = {}
        self.ended = threading.Condition()
        self.started: list[int] = []
        self.reader = threading.Thread(target=self._read, name="rank-server", daemon=True)
        self.reader.start()

    def fork(
        self, run_dir: Path, env: dict[str, str], out: int, err: int, lock_fd: int | None
    ) -> ForkedRank:
        """One rank: `out`/`err` are descriptors for its stdout/stderr (duplicated by the
        transfer; the caller keeps its own)."""
        request = {"run_dir": str(run_dir), "env": env, "cwd": os.getcwd()}
        fds = [out, err] + ([lock_fd] if lock_fd is not None else [])
        with self.ended:
            before = len(self.started)
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            if not self.ended.wait_for(lambda: len(self.started) > before or self.gone, 120):
                raise RuntimeError("the rank server did not fork the rank within 120 s")
            if len(self.started) == before:
                raise RuntimeError(f"the rank server ended ({self.process.poll()}); see its log")
            return ForkedRank(self, self.started[before])

    @property
    def gone(self) -> bool:
        return self.process.poll() is not None

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:  # the server ended: its ranks with it (SIGTERM from prctl)
                self.process.wait()
                with self.ended:
                    self.ended.notify_all()
                return
            with self.ended:
                report = json.loads(data)
                if "started" in report:
                    self.started.append(int(report["started"]))
                else:
                    self.exit_codes[int(report["pid"])] = int(report["code"])
                self.ended.notify_all()

    def close(self) -> None:
        """The server ends at once (its ranks have ended: the launcher waited for them)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
