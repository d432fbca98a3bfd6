"""Listing checkpoints: committed `step-N` directories, and torn `.tmp` ones left by a killed
save, which are never chosen and are removed at start (toolkit.checkpoint.resume verifies)."""

from __future__ import annotations

import logging
from pathlib import Path

from toolkit.checkpoint.layout import parse_step, parse_tmp_step
from toolkit.checkpoint.storage import Storage

log = logging.getLogger(__name__)


def committed_steps(storage: Storage, root: Path) -> list[int]:
    """Steps of committed checkpoint directories (verified or not), ascending."""
    steps = [parse_step(name) for name in storage.list(root)]
    return sorted(s for s in steps if s is not None)


def torn_dirs(storage: Storage, root: Path) -> list[Path]:
    return [root / n for n in storage.list(root) if parse_tmp_step(n) is not None]


def remove_torn(storage: Storage, root: Path) -> list[Path]:
    """Delete uncommitted `.tmp` directories (call only when no save is in flight)."""
    removed = []
    for path in torn_dirs(storage, root):
        log.warning("removing torn checkpoint %s (a save that never committed)", path)
        storage.remove(path)
        removed.append(path)
    return removed
