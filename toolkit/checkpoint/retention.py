"""Which checkpoints to delete (pure), and the worker that deletes them off the training thread."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from toolkit.checkpoint.priority import lower_this_thread

log = logging.getLogger(__name__)


def steps_to_delete(committed: list[int], keep_last: int, keep_every: int) -> list[int]:
    """Committed steps that retention removes: all but the newest `keep_last`, except
    multiples of `keep_every` (kept forever when > 0). The newest is never returned."""
    ordered = sorted(set(committed))
    keep = set(ordered[-max(1, keep_last) :])
    if keep_every > 0:
        keep |= {s for s in ordered if s % keep_every == 0}
    return [s for s in ordered if s not in keep]


_STOP = object()


class Purger:
    """Deletes paths in a background thread fed by a queue; `close()` sends a sentinel and
    joins. A failed deletion is logged and skipped: it never reaches the training loop."""

    def __init__(self, remove: Callable[[Path], None], priority: str = "normal"):
        self._remove = remove
        self._priority = priority
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="checkpoint-purge", daemon=True)
        self._thread.start()

    def submit(self, path: Path) -> None:
        self._queue.put(path)

    def _run(self) -> None:
        lower_this_thread(self._priority)
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._remove(item)
                log.info("retention: removed %s", item)
            except Exception as exc:  # noqa: BLE001 - log and skip, never stop the worker
                log.warning("retention: could not remove %s: %s", item, exc)

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()
