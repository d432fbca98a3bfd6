"""What a tracker missed while it was down: RUN_DIR/tracking/spool-<tracker>.jsonl.

One JSON object per line (0600, plain data: step records, events, and a `finish` line when
the tracker's run could not be ended), at most `max_records` of them: beyond, records are
dropped and counted. The tracker's worker sends the spool before its next batch once the
server answers again (also in the next attempt), and `toolkit track sync RUN` sends what is
left and ends the tracker's run; then the file is removed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from toolkit.events import Event, StepRecord, event_from_line, step_from_line, step_line

log = logging.getLogger(__name__)


def spool_path(run_dir: Path, tracker: str) -> Path:
    return run_dir / "tracking" / f"spool-{tracker}.jsonl"


class Spool:
    def __init__(self, path: Path, max_records: int):
        self.path = path
        self.max_records = max_records
        # What an earlier attempt left (records: its note of an unended run is none).
        self.count = sum('"kind": "finish"' not in line for line in self._lines())

    def add(self, items: list[StepRecord | Event]) -> int:
        """Append `items` (as many as the bound allows); returns how many were dropped."""
        room = max(0, self.max_records - self.count)
        lines = [_encode(item) for item in items[:room]]
        if lines:
            self._append(lines)
            self.count += len(lines)
        return len(items) - len(lines)

    def mark_unfinished(self) -> None:
        """The tracker's run could not be ended: the next contact (sync) ends it."""
        self._append([json.dumps({"kind": "finish"})])

    def read(self) -> tuple[list[StepRecord | Event], bool]:
        """The spooled records in order, and whether the tracker's run is left unfinished.
        A line that is not a record of ours (cut by a crash) is skipped."""
        items: list[StepRecord | Event] = []
        unfinished = False
        for line in self._lines():
            try:
                record = json.loads(line)
                kind = record.pop("kind")
                if kind == "finish":
                    unfinished = True
                elif kind == "step":
                    items.append(step_from_line(record))
                elif kind == "event":
                    items.append(event_from_line(record))
            except (ValueError, TypeError, KeyError, AttributeError):
                continue
        return items, unfinished

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        self.count = 0

    def _lines(self) -> list[str]:
        try:
            return [line for line in self.path.read_text().splitlines() if line.strip()]
        except OSError:
            return []

    def _append(self, lines: list[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write("".join(line + "\n" for line in lines))


def _encode(item: StepRecord | Event) -> str:
    if isinstance(item, StepRecord):
        return json.dumps({"kind": "step", **step_line(item)})
    return json.dumps({"kind": "event", **dataclasses.asdict(item)}, default=str)
