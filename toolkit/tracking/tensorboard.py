"""TensorBoard: event files under RUN_DIR/tracking/tensorboard (a resumed run adds a file to
the same directory, which TensorBoard reads as one run).

The summaries are torch's (`torch.utils.tensorboard.summary`), written by this tracker's
own worker thread (toolkit.tracking.base.TrackerSink) straight into the event file, without
SummaryWriter's second writer thread: a failure to write (disk full, directory gone) is an
OSError in the worker, one warning, not a thread's traceback.

Everything imported is imported when the tracker is built, on the caller's thread. Imported
first in the worker, torch was half-initialised when the script's own thread imported it at
the same time (`No module named 'torch._C._distributed_c10d'`, then an abort: exit 134), and
a script that ended within a second left the import to the interpreter's shutdown ("can't
register atexit after shutdown"): the tracker never opened and its records were lost.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from toolkit.events import Event, StepRecord
from toolkit.tracking.base import Params, event_scalars, scalars


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self._file: Any = None
        self._records: Any = None
        self._purge = False
        try:
            from tensorboard.compat.proto import event_pb2
            from tensorboard.summary.writer.record_writer import RecordWriter
            from torch.utils.tensorboard import summary
        except ImportError as exc:  # said once, as the tracker's failure to open
            self._missing: ImportError | None = exc
        else:
            self._missing = None
            self._event, self._record_writer, self._summary = event_pb2, RecordWriter, summary

    def open(self, params: Params) -> None:
        if self._missing is not None:
            raise self._missing
        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A resumed attempt: its first step purges what earlier attempts wrote from there on.
        self._purge = any(self.log_dir.glob("events.out.tfevents.*"))
        name = f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}.{os.getpid()}.0"
        self._file = open(self.log_dir / name, "wb")  # noqa: SIM115 - closed in finish()
        self._records = self._record_writer(self._file)
        self._write(self._event.Event(wall_time=time.time(), file_version="brain.Event:2"))
        text = "\n".join(f"    {k}: {v}" for k, v in sorted(params.config.items()))
        self._text("config", text)
        self._text("overrides", "    " + (" ".join(params.overrides) or "(none)"))
        self._file.flush()

    def log(self, items: list[StepRecord | Event]) -> None:
        for item in items:
            if isinstance(item, StepRecord):
                if self._purge:
                    self._purge_from(item.step, item.wall_time)
                values = scalars(item)
            else:
                values = event_scalars(item)
                if item.name != "eval":
                    attrs = json.dumps(item.attrs, default=str)
                    self._text(f"event/{item.name}", attrs, item.step, _walltime(item))
            for tag, value in values.items():
                self._scalar(tag, value, item.step, _walltime(item))
        self._file.flush()

    def missing_steps(self, steps: list[int]) -> set[int]:
        """Of `steps`, every one from the first the log dir has no train/loss of (read with
        TensorBoard's own reader): the records written from there start a session that
        purges what followed, so TensorBoard shows one line (toolkit track sync)."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        reader = EventAccumulator(str(self.log_dir), size_guidance={"scalars": 0})
        reader.Reload()
        loss = "train/loss" in reader.Tags().get("scalars", [])
        have = {e.step for e in reader.Scalars("train/loss")} if loss else set()
        gaps = [s for s in steps if s not in have]
        return {s for s in steps if gaps and s >= min(gaps)}

    def log_series(self, series: dict[str, list[tuple[float, float]]]) -> None:
        for tag, points in series.items():  # step: seconds since the series' first sample
            for t, value in points:
                self._scalar(tag, value, int(t - points[0][0]), t)
        self._file.flush()

    def finish(self, artifacts: list[Path]) -> None:
        try:
            for path in artifacts:
                if path.suffix == ".json":
                    self._text(f"artifact/{path.name}", "    " + path.read_text())
        finally:
            self._file.close()

    def describe(self) -> dict[str, Any]:
        return {"logdir": str(self.log_dir)}

    def _purge_from(self, step: int, walltime: float) -> None:
        """TensorBoard's reader drops the earlier records of `step` and later on a session
        start at `step` (SummaryWriter's purge_step): a resumed run shows one line, the last
        attempt's, instead of both attempts' records of the repeated steps."""
        self._purge = False
        start = self._event.SessionLog(status=self._event.SessionLog.START)
        self._write(self._event.Event(step=int(step), wall_time=walltime, session_log=start))

    def _scalar(self, tag: str, value: float, step: int, walltime: float) -> None:
        self._add(self._summary.scalar(tag, float(value)), step, walltime)

    def _text(self, tag: str, text: str, step: int = 0, walltime: float | None = None) -> None:
        self._add(self._summary.text(tag, text), step, walltime)

    def _add(self, summary: Any, step: int, walltime: float | None) -> None:
        wall = time.time() if walltime is None else walltime
        self._write(self._event.Event(summary=summary, step=int(step), wall_time=wall))

    def _write(self, event: Any) -> None:
        self._records.write(event.SerializeToString())


def _walltime(item: StepRecord | Event) -> float:
    return item.wall_time if isinstance(item, StepRecord) else item.end
