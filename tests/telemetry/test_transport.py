"""The rank -> agent socket is private to the job's user: it lives in a directory only this
user can open (created 0700, refused when someone else owns it or it is open to others), and
the agent drops datagrams that another uid managed to send (the kernel names the sender)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkit.telemetry.transport import Receiver, UnsafeSocketDir, socket_dir, socket_path

pytestmark = pytest.mark.timeout(60)
NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short private directory (socket paths hold at most 107 bytes; tmp_path is long)."""
    path = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tmpdir_only(monkeypatch, short_dir: Path) -> Path:
    """No usable $XDG_RUNTIME_DIR; $TMPDIR is `short_dir` (as on a node without a session)."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(short_dir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches its first answer
    return short_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_socket_lives_in_the_users_runtime_dir(monkeypatch, short_dir, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    path = Path(socket_path(tmp_path, "node1", "42", 0))
    assert path.parent == short_dir / "toolkit"
    assert mode(path.parent) == 0o700 and path.parent.stat().st_uid == os.getuid()
    receiver = Receiver(str(path))
    try:
        assert mode(path) == 0o600
    finally:
        receiver.close()


def test_without_a_runtime_dir_the_socket_lives_in_a_private_dir_under_tmp(tmpdir_only, tmp_path):
    path = Path(socket_path(tmp_path, "node1", "42", 0))
    assert path.parent == tmpdir_only / f"toolkit-{os.getuid()}"
    assert mode(path.parent) == 0o700
    assert len(str(path).encode()) <= 107


def test_a_runtime_dir_open_to_others_is_not_used(monkeypatch, tmpdir_only, short_dir):
    runtime = short_dir / "run-user"
    runtime.mkdir(mode=0o755)
    runtime.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert socket_dir() == tmpdir_only / f"toolkit-{os.getuid()}"


@as_root
def test_a_socket_dir_squatted_by_another_user_is_refused(tmpdir_only, tmp_path):
    squatted = tmpdir_only / f"toolkit-{os.getuid()}"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, NOBODY, NOBODY)
    with pytest.raises(UnsafeSocketDir, match=f"owned by uid {NOBODY}, not by this user"):
        socket_path(tmp_path, "node1", "42", 0)


def test_a_socket_dir_open_to_others_is_refused(tmpdir_only, tmp_path):
    opened = tmpdir_only / f"toolkit-{os.getuid()}"
    opened.mkdir()
    opened.chmod(0o777)
    with pytest.raises(UnsafeSocketDir, match="mode 0777, open to other users"):
        socket_path(tmp_path, "node1", "42", 0)


def test_a_symlink_in_place_of_the_socket_dir_is_refused(tmpdir_only, tmp_path, short_dir):
    elsewhere = short_dir / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmpdir_only / f"toolkit-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(UnsafeSocketDir, match="not a directory"):
        socket_path(tmp_path, "node1", "42", 0)


def test_the_agent_refuses_to_bind_in_a_directory_open_to_others(short_dir):
    short_dir.chmod(0o755)
    with pytest.raises(UnsafeSocketDir):
        Receiver(str(short_dir / "tel.sock"))
    assert not (short_dir / "tel.sock").exists()


def in_child_as(uid: int, action) -> int:
    """Run `action()` in a forked child that switched to `uid` first; its exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = action()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@as_root
def test_a_datagram_from_another_uid_is_dropped_and_counted(tmpdir_only, tmp_path):
    path = socket_path(tmp_path, "node1", "42", 0)
    receiver = Receiver(path)

    def send_as_nobody() -> int:
        # Connected while still root (the 0700 dir keeps others from even reaching the
        # socket), then sent as another user: the uid checked is the one that sends.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.connect(path)
        os.setuid(NOBODY)
        sock.send(b'{"kind": "step", "step": 666}')
        return 0

    try:
        assert in_child_as(NOBODY, send_as_nobody) == 0
        own = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        own.sendto(b'{"kind": "step", "step": 1}', path)
        own.close()
        assert receiver.receive() == [{"kind": "step", "step": 1}]
        assert receiver.refused == 1
    finally:
        receiver.close()


@as_root
def test_another_uid_cannot_reach_the_socket_at_all(tmpdir_only, tmp_path):
    path = socket_path(tmp_path, "node1", "42", 0)
    receiver = Receiver(path)

    def send_as_nobody() -> int:
        os.setuid(NOBODY)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.sendto(b'{"kind": "step"}', path)
        except PermissionError:
            return 0
        return 1

    try:
        assert in_child_as(NOBODY, send_as_nobody) == 0
        assert receiver.receive() == [] and receiver.refused == 0
    finally:
        receiver.close()
