"""A rank's log files are capped (launch.max_log_bytes): a script that prints without end
does not fill the disk.

A rank's stdout and stderr are files in its run dir (logs/rank<k>.out/.err locally, the
Slurm executor's per-task logs there): past the cap, the file is renamed to NAME.1 (the
previous NAME.1 is dropped) and a fresh NAME takes its place on the same descriptor
(`dup2`), so the newest output and one rotated file are kept, at most about twice the cap.
A descriptor that is not a regular file inside the run dir (a terminal, a pipe, a file the
user redirected the launcher into) is left alone.

A script's output passes through its rank's wrapper, which checks after every chunk
(`check`); a rank's own output is checked once a second (`watch`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
import time
from pathlib import Path

WATCH_S = 1.0

_lock = threading.Lock()
_caps: dict[int, tuple[Path, int]] = {}  # descriptor -> (its file, cap in bytes)


def cap(fd: int, run_dir: Path, max_bytes: int) -> bool:
    """Cap descriptor `fd` of this process at `max_bytes` (0: no cap) where it is a regular
    file inside `run_dir`; whether it is capped."""
    if max_bytes <= 0:
        return False
    try:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False
    if not (regular and path.is_relative_to(Path(run_dir).resolve())):
        return False
    with _lock:
        _caps[fd] = (path, max_bytes)
    check(fd)
    return True


def check(fd: int) -> None:
    """Rotate `fd`'s file if it has grown past its cap (nothing for a descriptor not capped)."""
    with _lock:
        if fd not in _caps:
            return
        path, max_bytes = _caps[fd]
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size > max_bytes:
                _rotate(fd, path)


def _rotate(fd: int, path: Path) -> None:
    for stream in (sys.stdout, sys.stderr):  # what Python buffered goes to the old file
        with contextlib.suppress(Exception):
            if stream.fileno() == fd:
                stream.flush()
    os.replace(path, path.with_name(path.name + ".1"))
    fresh = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fresh, fd)
    os.close(fresh)


def watch(run_dir: Path, max_bytes: int, fds: tuple[int, ...] = (1, 2)) -> None:
    """Cap this process's stdout and stderr; a daemon thread checks them once a second."""
    capped = [fd for fd in fds if cap(fd, run_dir, max_bytes)]
    if not capped:
        return

    def loop() -> None:
        while True:
            time.sleep(WATCH_S)
            for fd in capped:
                check(fd)

    threading.Thread(target=loop, name="log-cap", daemon=True).start()
