"""A real MLflow tracking server on loopback (`mlflow server`, SQLite backend, in a temp
dir), and a reader of W&B's offline run files."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="the tracking extra: pip install -e '.[tracking]'")

MLFLOW = Path(sys.executable).with_name("mlflow")


@dataclass
class MlflowServer:
    uri: str
    process: subprocess.Popen

    def kill(self) -> None:
        """The whole server (its uvicorn workers too), at once."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow_server(
    directory: Path, timeout_s: float = 90, port: int | None = None
) -> MlflowServer:
    """`mlflow server` on 127.0.0.1 (`port`: the one a stopped server of `directory` had, to
    start it again with its store)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    process = subprocess.Popen(
        [
            str(MLFLOW),
            "server",
            "--backend-store-uri",
            f"sqlite:///{directory / 'mlflow.db'}",
            "--artifacts-destination",
            str(directory / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=directory,
        stdout=open(directory / "server.log", "w"),  # noqa: SIM115 - the server keeps it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = MlflowServer(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {(directory / 'server.log').read_text()}")
        try:
            with urllib.request.urlopen(f"{server.uri}/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"mlflow server did not answer within {timeout_s} s")


@pytest.fixture
def mlflow_server_factory(tmp_path) -> Iterator:
    started: list[MlflowServer] = []

    def start(name: str = "mlflow", port: int | None = None) -> MlflowServer:
        started.append(start_mlflow_server(tmp_path / name, port=port))
        return started[-1]

    yield start
    for server in started:
        server.kill()


def wandb_history(run_file: Path) -> list[dict[str, float]]:
    """The history rows of a W&B offline run file (run-<id>.wandb): W&B's record log (a
    7-byte header, then 32 KiB blocks of records: crc32, length, type, protobuf bytes) read
    with W&B's own protobuf schema."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file}: not a W&B run file"
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in the block for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        pending += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
        elif kind == 0:  # zero padding at a block's end
            pos += block - pos % block
    return rows
