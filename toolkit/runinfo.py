"""What a run directory records about where and how it ran."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from toolkit.files import write_private
from toolkit.redact import REDACTED, redact, redact_env

__all__ = ["REDACTED", "redact_env", "snapshot", "write_snapshot"]


def git_state(repo: Path) -> dict[str, Any]:
    def run(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", "-C", str(repo), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    sha = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def torch_versions() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        info["nccl"] = (
            ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
        )
    except Exception:  # noqa: BLE001 - NCCL missing from a CPU build
        info["nccl"] = None
    info["cuda_devices"] = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return info


def packages() -> list[str]:
    """`pip freeze` without a subprocess: name==version of every installed distribution."""
    # Each `.metadata` parses the distribution's METADATA file anew: read it once per package.
    found = (d.metadata for d in metadata.distributions())
    return sorted({f"{m['Name']}=={m['Version']}" for m in found if m["Name"]})


def snapshot() -> dict[str, Any]:
    return {
        "time": time.time(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version,
        "executable": sys.executable,
        "argv": redact(sys.argv),
        "git": git_state(Path(__file__).resolve().parents[1]),
        **torch_versions(),
        "packages": packages(),
        "environment": redact_env(dict(os.environ)),
    }


def write_snapshot(path: Path) -> None:
    write_private(path, json.dumps(snapshot(), indent=2, sort_keys=True))
