"""Rank -> node agent messages: JSON datagrams on a Unix socket, sent without blocking.

A datagram socket keeps no connection state: a rank can send before the agent is up and
after it died. A message that cannot be sent now (agent not yet bound, its queue full,
agent gone) waits in a bounded in-memory queue and is retried on the next send; when the
queue is full the oldest message is dropped and counted. Sending never raises.

The socket lives in a directory only this user can open ($XDG_RUNTIME_DIR/toolkit, else
$TMPDIR/toolkit-<uid>), created 0700 and checked before use: a name in shared /tmp could be
squatted by another user to read the step records or to inject some. The receiver also
checks the sender's uid of every datagram (SCM_CREDENTIALS) and drops, and counts, those
from another user.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_DATAGRAM_BYTES = 60_000
MAX_SOCKET_PATH_BYTES = 107  # sun_path holds 108 bytes, the last one a NUL
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class UnsafeSocketDir(RuntimeError):
    """The socket directory is not private to this user; nothing is bound or sent there."""


def private_dir(path: Path) -> Path:
    """`path`, created 0700 when absent; refused unless it is a real directory (not a
    symlink) owned by this user with no group or other permission bits."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeSocketDir(f"telemetry socket dir {path}: not a directory; remove it")
    if st.st_uid != os.getuid():
        raise UnsafeSocketDir(
            f"telemetry socket dir {path}: owned by uid {st.st_uid}, not by this user "
            f"(uid {os.getuid()}); remove it, or set XDG_RUNTIME_DIR to a private directory"
        )
    if st.st_mode & 0o077:
        raise UnsafeSocketDir(
            f"telemetry socket dir {path}: mode {stat.S_IMODE(st.st_mode):04o}, open to other "
            "users; remove it (it is created 0700)"
        )
    return path


def _usable_runtime_dir() -> Path | None:
    """$XDG_RUNTIME_DIR when it is set and what its spec promises: ours, mode 0700."""
    value = os.environ.get("XDG_RUNTIME_DIR")
    if not value:
        return None
    try:
        st = os.stat(value)
    except OSError:  # set on the login node, absent here
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return Path(value)


def socket_dir(name_bytes: int = 32) -> Path:
    """The private directory of this user's telemetry sockets (created 0700, checked).

    Every rank of a node computes it on its own, so it depends on the user and environment
    only. Short on purpose: a socket path holds at most 107 bytes."""
    runtime = _usable_runtime_dir()
    if runtime is not None and len(str(runtime / "toolkit")) + 1 + name_bytes <= 107:
        return private_dir(runtime / "toolkit")
    return private_dir(Path(tempfile.gettempdir()) / f"toolkit-{os.getuid()}")


def socket_path(run_dir: Path, node: str, job_id: str | None, restart: int) -> str:
    """A short, per node/job/attempt path in this user's private socket dir."""
    key = f"{Path(run_dir).resolve()}|{node}|{job_id}|{restart}".encode()
    name = f"tel-{hashlib.sha1(key).hexdigest()[:16]}.sock"
    path = str(socket_dir(len(name)) / name)
    if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
        raise UnsafeSocketDir(
            f"telemetry socket {path}: longer than {MAX_SOCKET_PATH_BYTES} bytes; "
            "set TMPDIR or XDG_RUNTIME_DIR to a shorter private directory"
        )
    return path


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, default=str, separators=(",", ":")).encode()
    if len(data) > MAX_DATAGRAM_BYTES:
        attrs = message.get("attrs")
        message = {**message, "attrs": {"truncated": True, "keys": sorted(attrs or {})}}
        data = json.dumps(message, default=str, separators=(",", ":")).encode()
    return data


class Sender:
    def __init__(self, path: str, max_pending: int = 10000):
        self.path = path
        self.pending: collections.deque[bytes] = collections.deque()
        self.max_pending = max_pending
        self.dropped = 0
        self.sent = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    def send(self, message: dict[str, Any]) -> None:
        try:
            if self.max_pending == 0:
                self.dropped += 1
                return
            if len(self.pending) >= self.max_pending:
                self.pending.popleft()
                self.dropped += 1
            self.pending.append(encode(message))
            self.drain()
        except Exception:  # noqa: BLE001 - telemetry must never reach the training loop
            log.debug("telemetry send failed", exc_info=True)

    def drain(self) -> bool:
        """Send what is queued; True when nothing is left."""
        while self.pending:
            try:
                self._sock.sendto(self.pending[0], self.path)
            except (BlockingIOError, FileNotFoundError, ConnectionRefusedError, OSError):
                return False
            self.pending.popleft()
            self.sent += 1
        return True

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.drain():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        self._sock.close()


class Receiver:
    """Binds `path` (its directory must be private to this user) and receives the datagrams
    of this user's processes; those of another uid are dropped and counted in `refused`."""

    def __init__(self, path: str):
        self.path = path
        self.refused = 0
        private_dir(Path(path).parent)
        Path(path).unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        # The kernel then attaches every sender's pid/uid/gid to its datagrams (SO_PEERCRED
        # would not: a datagram socket has no peer).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self, limit: int = 10000) -> list[dict[str, Any]]:
        out = []
        for _ in range(limit):
            try:
                data, ancdata, _, _ = self.sock.recvmsg(
                    MAX_DATAGRAM_BYTES + 1024, socket.CMSG_SPACE(_UCRED.size)
                )
            except (BlockingIOError, InterruptedError):
                break
            uid = sender_uid(ancdata)
            if uid != os.getuid():
                self.refused += 1
                if self.refused == 1:
                    log.warning(
                        "telemetry: dropped a datagram from uid %s (not this user's); "
                        "counting the others",
                        uid,
                    )
                continue
            try:
                out.append(json.loads(data))
            except ValueError:
                log.warning("telemetry: undecodable message of %d bytes skipped", len(data))
        return out

    def close(self) -> None:
        if self.refused:
            log.warning("telemetry: dropped %d datagrams from other users", self.refused)
        self.sock.close()
        Path(self.path).unlink(missing_ok=True)


def sender_uid(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The sender's uid from a datagram's SCM_CREDENTIALS (None when absent)."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return _UCRED.unpack(data[: _UCRED.size])[1]
    return None
