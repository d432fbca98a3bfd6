"""`python -m toolkit.rank_server FD [TASK]`: the server of `launch.rank_start=fork`
(toolkit.executors.rank_start). Imports what every rank imports, then, for each request on
the socket FD (a rank's run dir, environment and working directory, with its stdout, stderr
and run-dir lock as descriptors), forks the rank and says its pid; says each rank's exit
status when it ends; ends with `os._exit` when the launcher closes the socket.

Nothing imported here may start a thread or touch CUDA: the ranks are forked from it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import traceback

from toolkit.executors.local import end_with
from toolkit.executors.rank_start import MESSAGE_BYTES

# Signals meant for the ranks (a preemption notice, Ctrl-C, a group-wide SIGTERM) that
# would otherwise end the server: it ignores them, its ranks get their defaults back.
LEFT_TO_THE_RANKS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def preload(task: str = "train") -> None:
    """What every rank of `task` imports. A script's ranks get torch and the wrapper alone:
    what else the script imports (FSDP, dynamo, ...) it imports itself, as under torchrun."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import toolkit.config.compose  # noqa: F401
    import toolkit.entrypoint  # noqa: F401
    import toolkit.tasks  # noqa: F401

    if task == "script":
        import toolkit.tasks.script  # noqa: F401
        import toolkit.tasks.script_runner  # noqa: F401
        import toolkit.tasks.watchdog  # noqa: F401

        return
    import torch._dynamo  # noqa: F401 - fully_shard imports it (~0.4 s)
    import torch.distributed.fsdp  # noqa: F401

    import toolkit.distributed.init  # noqa: F401
    import toolkit.train.models.registry  # noqa: F401


def serve(sock: socket.socket) -> None:
    """Fork on request, report exits, until the launcher hangs up."""
    for sig in LEFT_TO_THE_RANKS:
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a rank ended: select wakes on wake_r
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 3)
                if not data:
                    os._exit(0)  # the launcher is done (or dead: the ranks get SIGTERM)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    become_rank(json.loads(data), fds)  # never returns
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"started": pid}).encode())
            else:
                os.read(wake_r, 512)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.send(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def become_rank(request: dict, fds: list[int]) -> None:
    """In the forked child: what `python -m toolkit.entrypoint RUN_DIR` would be with the
    request's environment, run as the entrypoint runs it."""
    server = os.getppid()
    signal.set_wakeup_fd(-1)
    for sig in (*LEFT_TO_THE_RANKS, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    end_with(server)()  # SIGTERM when the server dies, as an exec'd rank's launcher
    out, err = fds[0], fds[1]  # fds[2], the run dir's lock, stays open until the rank ends
    null = os.open(os.devnull, os.O_RDONLY)
    for src, dst in ((null, 0), (out, 1), (err, 2)):
        os.dup2(src, dst)
        os.close(src)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)  # as PYTHONUNBUFFERED=1
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from toolkit import entrypoint

    sys.argv = [entrypoint.__file__, request["run_dir"]]
    try:
        code = entrypoint.main([request["run_dir"]])
    except SystemExit as stop:  # as the interpreter maps it
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it, exit 1
        traceback.print_exc()
        code = 1
    entrypoint.exit_without_teardown(code)


def main(argv: list[str]) -> None:
    """argv: the socket's descriptor, then the task its ranks run (`train`, `script`)."""
    sock = socket.socket(fileno=int(argv[0]))
    preload(argv[1] if len(argv) > 1 else "train")
    serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
