"""Finding checkpoints: only committed directories whose manifest verifies count; torn
`.tmp` directories left by a killed save are never chosen and are removed at start."""

from __future__ import annotations

import logging
from pathlib import Path

from toolkit.checkpoint.layout import parse_step, parse_tmp_step
from toolkit.checkpoint.manifest import CheckpointCorrupt, Manifest, verify
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


def latest_valid(
    storage: Storage, root: Path, *, checksums: bool = True, fallback: bool = True
) -> tuple[Path, Manifest] | None:
    """The newest committed checkpoint whose manifest verifies. A corrupt one is skipped
    with a warning naming the bad file (fallback) or raises CheckpointCorrupt (no fallback)."""
    from toolkit.checkpoint.layout import committed_path

    for step in reversed(committed_steps(storage, root)):
        path = committed_path(root, step)
        try:
            return path, verify(path, checksums)
        except CheckpointCorrupt as exc:
            if not fallback:
                raise CheckpointCorrupt(
                    f"{exc}; checkpoint.on_corrupt=fail (use fallback to resume from an older one)"
                ) from None
            log.warning("skipping corrupt checkpoint: %s; falling back to an older one", exc)
    return None
