"""Files that hold a job's data, written readable only by the job's user."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, readable only by this user (0600), creating a missing
    parent directory (0700). The file is replaced, not written through: a reader never sees
    it half-written, and an older copy's wider mode does not survive."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:  # name the file asked for, not the temporary beside it
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
