"""Scheduling priority of the checkpoint's background threads, so that writing and
checksumming a checkpoint takes CPU time the training loop does not want.

Linux schedules threads, not processes, so a priority set here applies to the calling
thread only: the training thread keeps its own. An unprivileged thread cannot raise its
priority again, so only threads that do nothing but background work are lowered:

- idle: SCHED_IDLE, the thread runs only on CPU time no other thread wants (training
  waiting on a collective, data or a save);
- low: nice 19, a small share (about 1.5 %) of a core that training also wants;
- normal: unchanged.

When training waits for a save (before the next one, at the end, on preemption) its cores
are idle, so a lowered writer then runs at full speed.
"""

from __future__ import annotations

import logging
import os
import threading

from toolkit.config.checkpoint import CheckpointConfig

log = logging.getLogger(__name__)

PRIORITIES = CheckpointConfig.WRITER_PRIORITY  # idle, low, normal
_warned = False


def lower_this_thread(priority: str) -> None:
    """Apply `priority` to the calling thread. Never raises: where the platform refuses,
    the thread keeps its priority and one warning is logged."""
    global _warned
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority!r}: allowed {', '.join(PRIORITIES)}")
    if priority == "normal":
        return
    tid = threading.get_native_id()
    try:
        if priority == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
    except (AttributeError, OSError) as exc:  # not Linux, or a sandbox that forbids it
        if not _warned:
            _warned = True
            log.warning("checkpoint threads keep normal priority (%s: %s)", priority, exc)


def describe_this_thread() -> str:
    """'idle', 'low' or 'normal' for the calling thread (for tests and logs)."""
    tid = threading.get_native_id()
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(tid) == os.SCHED_IDLE:
        return "idle"
    return "low" if os.getpriority(os.PRIO_PROCESS, tid) > 0 else "normal"
