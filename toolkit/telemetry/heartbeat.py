"""A rank's heartbeat: 64 bytes of shared memory the node agent reads, written without a
system call.

Each rank maps its own small file in the node's private socket directory (beside the
telemetry socket) and rewrites it in place at every progress point: a phase boundary of the
training loop, and the entry and exit of every collective of the training thread
(toolkit.distributed.commtime). A write is one `struct.pack_into` into the mapping (well
under a microsecond); no datagram, no lock, nothing that can block the rank. The agent's
watchdog (toolkit.telemetry.watchdog) reads every local rank's file a few times a second: a
`progress` counter that stops moving is a rank that stopped making progress, and the
collective fields say which collective it last entered and which one it is blocked in.

A torn read (the rank writing while the agent reads) can at worst count as one more
progress step; the watchdog needs a stall of many seconds, so it does not matter.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from pathlib import Path
from typing import Any

# pid, progress, step, entered_seq, blocked_seq, phase, entered_op, blocked_op
_LAYOUT = struct.Struct("<qqqqqiii")
SIZE = 64
PHASES = ("startup", "data", "step", "hooks", "eval", "end")
# Phases whose normal duration is not bounded by the step time: the startup limit applies.
LONG_PHASES = frozenset({"startup", "hooks"})
OPS = (
    "none",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "broadcast",
    "send",
    "recv",
    "isend",
    "irecv",
    "barrier",
    "other",
)
_OP_CODE = {name: i for i, name in enumerate(OPS)}


def heartbeat_path(socket: str, rank: int) -> Path:
    """Rank `rank`'s heartbeat file, beside the node's telemetry socket (private dir)."""
    return Path(f"{socket.removesuffix('.sock')}.rank{rank}.hb")


class Heartbeat:
    """The rank side. Every method is a few attribute updates and one pack_into."""

    def __init__(self, path: Path):
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.pid = os.getpid()
        self.progress = 0
        self.step = 0
        self.phase = 0
        self.entered_seq = 0
        self.entered_op = 0
        self.blocked_seq = 0
        self.blocked_op = 0
        self._write()

    def _write(self) -> None:
        if self._map.closed:  # a collective after close (wrappers not yet removed): no-op
            return
        _LAYOUT.pack_into(
            self._map,
            0,
            self.pid,
            self.progress,
            self.step,
            self.entered_seq,
            self.blocked_seq,
            self.phase,
            self.entered_op,
            self.blocked_op,
        )

    def beat(self, phase: str, step: int) -> None:
        """The training loop reached `phase` of step `step` (steps completed so far)."""
        self.progress += 1
        self.phase = PHASES.index(phase)
        self.step = step
        self._write()

    def enter(self, op: str) -> int:
        """The thread enters a collective (and blocks in it until `leave`): its number."""
        self.progress += 1
        self.entered_seq += 1
        self.entered_op = self.blocked_op = _OP_CODE.get(op, _OP_CODE["other"])
        self.blocked_seq = self.entered_seq
        self._write()
        return self.entered_seq

    def block(self, seq: int, op: str) -> None:
        """The thread waits for collective `seq` (issued earlier with async_op)."""
        self.progress += 1
        self.blocked_seq = seq
        self.blocked_op = _OP_CODE.get(op, _OP_CODE["other"])
        self._write()

    def leave(self) -> None:
        self.progress += 1
        self.blocked_seq = 0
        self.blocked_op = 0
        self._write()

    def close(self, remove: bool = True) -> None:
        with contextlib.suppress(Exception):
            self.beat("end", self.step)
            self._map.close()
            if remove:
                self.path.unlink(missing_ok=True)


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    """A rank's last heartbeat, or None when its file is absent or short."""
    try:
        with open(path, "rb") as f:
            data = f.read(_LAYOUT.size)
    except OSError:
        return None
    if len(data) < _LAYOUT.size:
        return None
    pid, progress, step, entered_seq, blocked_seq, phase, entered_op, blocked_op = _LAYOUT.unpack(
        data
    )
    return {
        "pid": pid,
        "progress": progress,
        "step": step,
        "phase": PHASES[phase] if 0 <= phase < len(PHASES) else "startup",
        "entered_seq": entered_seq,
        "entered_op": OPS[entered_op] if 0 <= entered_op < len(OPS) else "other",
        "blocked_seq": blocked_seq,
        "blocked_op": OPS[blocked_op] if 0 <= blocked_op < len(OPS) else "other",
    }
