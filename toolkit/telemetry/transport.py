"""Rank -> node agent messages: JSON datagrams on a Unix socket, sent without blocking.

A datagram socket keeps no connection state: a rank can send before the agent is up and
after it died. A message that cannot be sent now (agent not yet bound, its queue full,
agent gone) waits in a bounded in-memory queue and is retried on the next send; when the
queue is full the oldest message is dropped and counted. Sending never raises.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_DATAGRAM_BYTES = 60_000


def socket_path(run_dir: Path, node: str, job_id: str | None, restart: int) -> str:
    """A short, per node/job/attempt path (Unix socket paths are limited to ~100 bytes)."""
    key = f"{Path(run_dir).resolve()}|{node}|{job_id}|{restart}".encode()
    return str(Path(tempfile.gettempdir()) / f"tk-tel-{hashlib.sha1(key).hexdigest()[:16]}.sock")


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
    def __init__(self, path: str):
        self.path = path
        Path(path).unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind(path)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self, limit: int = 10000) -> list[dict[str, Any]]:
        out = []
        for _ in range(limit):
            try:
                data = self.sock.recv(MAX_DATAGRAM_BYTES + 1024)
            except (BlockingIOError, InterruptedError):
                break
            try:
                out.append(json.loads(data))
            except ValueError:
                log.warning("telemetry: undecodable message of %d bytes skipped", len(data))
        return out

    def close(self) -> None:
        self.sock.close()
        Path(self.path).unlink(missing_ok=True)
