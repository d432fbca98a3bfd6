"""Nothing a rank starts outlives it: the rank's process is a child subreaper (Linux), and
what is left below it when the rank ends is ended too.

A script's forked children, its DataLoader workers and a daemon that left its session with
`setsid` and a double fork all stay below the process that runs the rank: an orphan goes to
its nearest subreaper ancestor instead of to init (PID 1). A `setsid` daemon escapes a kill of
the process group, not this: `end` walks /proc for every process whose parent chain leads
here, SIGTERMs them, and SIGKILLs what still runs after a grace period.

Imports nothing of the toolkit: the launcher, the rank and the script's wrapper all use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Iterable

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
POLL_S = 0.05
PARENT_POLL_S = 0.2

_spared: set[int] = set()  # pids that end by themselves (the node agent): never signalled


def become_subreaper() -> bool:
    """Orphans below this process become its children (prctl PR_SET_CHILD_SUBREAPER);
    False where the kernel offers no such thing."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False


def spare(pid: int) -> None:
    """`pid` (and what runs below it) ends by itself: `end` leaves it alone."""
    _spared.add(pid)


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid, from /proc/PID/stat; None once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1])


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def below(root: int | None = None, keep: Iterable[int] = ()) -> list[int]:
    """The live processes whose parent chain leads to `root` (this process by default), less
    the subtrees of `keep` and of the spared ones; parents before their children."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[0] not in ("Z", "X"):
                children.setdefault(stat[1], []).append(int(name))
    left_out = set(keep) | _spared
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        if pid in left_out:
            continue
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those that are this process's children (adopted orphans),
    so that they do not linger as zombies."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end(grace_s: float, root: int | None = None, keep: Iterable[int] = ()) -> list[int]:
    """End everything below `root` (less `keep`'s subtrees): SIGTERM, then SIGKILL after
    `grace_s` what still runs (and what was started meanwhile). Returns the pids found."""
    keep = set(keep)
    first = below(root, keep)
    if not first:
        return []
    ended = set(first)
    _signal(first, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while True:
        _reap(ended)
        left = below(root, keep)
        ended.update(left)
        if not left:
            return sorted(ended)
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    for _ in range(3):  # a process may fork between the walk and the kill: walk again
        _signal(left, signal.SIGKILL)
        time.sleep(POLL_S)
        _reap(ended)
        left = below(root, keep)
        ended.update(left)
        if not left:
            break
    return sorted(ended)


def kill_now(root: int | None = None) -> None:
    """SIGKILL everything below `root` at once, without waiting (a rank that is failing)."""
    for _ in range(2):
        left = below(root)
        if not left:
            return
        _signal(left, signal.SIGKILL)
        _reap(left)


def end_with_parent(grace_s: float) -> None:
    """Once this process's parent is gone (its launcher or rank server killed, even by
    SIGKILL), leave it `grace_s` to end on the SIGTERM that the parent's death sent
    (PR_SET_PDEATHSIG: a preemption, to checkpoint at the next step), then SIGKILL
    everything below it and itself: a script that ignores SIGTERM, or a rank stuck in a
    collective, does not run on unsupervised holding the run dir's lock."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        time.sleep(grace_s)
        kill_now()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()
