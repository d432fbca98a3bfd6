"""What the node agent tells the rank that started it: `<socket>.status`, a small JSON file
beside the node's socket (this user's private directory, not the run dir: the run dir's
disk may be the one that filled).

The agent writes it when rows of the node file could not be written (a full disk, a quota);
the rank reads it every few seconds (a stat) and says it in one line in its log, which is
the console for rank 0, so that a telemetry disk that fills is seen while the run goes on.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from toolkit.files import write_private


def status_path(socket: str) -> Path:
    return Path(f"{socket}.status")


def write_status(socket: str, status: dict[str, Any]) -> bool:
    """Atomically, 0600; False when it could not be written (the agent logs that)."""
    try:
        write_private(status_path(socket), json.dumps(status))
        return True
    except OSError:
        return False


def read_status(socket: str) -> dict[str, Any] | None:
    try:
        status = json.loads(status_path(socket).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def remove_status(socket: str) -> None:
    with contextlib.suppress(OSError):
        status_path(socket).unlink()


def write_failure_line(status: dict[str, Any]) -> str:
    """`telemetry: node file X not written: No space left on device; 1990 rows dropped (...)`."""
    tables = ", ".join(sorted(status["dropped"]))
    return (
        f"telemetry: node file {status['path']} not written: {status['error']}; "
        f"{sum(status['dropped'].values())} rows dropped so far ({tables}): the report will "
        "lack them; free space there or set telemetry=off"
    )
