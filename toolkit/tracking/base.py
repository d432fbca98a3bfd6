"""A tracker behind a bounded queue, on its own thread.

The training thread only puts records on the queue (`put_nowait`: a full queue drops the
record and counts it). The worker opens the tracker, sends records in batches, and at the
sentinel closes it: uploads the artifacts and ends the tracker's run. Any failure of the
tracker is logged once, counted as dropped records, and never raised into training.
`close()` waits at most `close_timeout_s` for the worker (a daemon thread: a hung tracker
cannot keep the process alive).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from toolkit.events import Event, StepRecord
from toolkit.tracking.spool import Spool

log = logging.getLogger(__name__)

_STOP = object()


@dataclass
class Params:
    """What the tracker records about the run once: the redacted config (flattened
    dotted keys) and the launch overrides, and the files to upload at the end."""

    config: dict[str, Any]
    overrides: list[str]
    run_name: str
    artifacts: list[Path] = field(default_factory=list)
    # At the end: node telemetry series, name -> [(time.time(), value)] (None: not sent).
    node_series: Callable[[], dict[str, list[tuple[float, float]]]] | None = None
    # The model's throughput unit: a samples model's step records go without the token
    # fields (tokens, tokens_per_s): its rate is samples_per_s.
    unit: str = "tokens"


class Tracker(Protocol):
    """One backend. Called from the worker thread only, never from training."""

    name: str

    def open(self, params: Params) -> None: ...

    def log(self, items: list[StepRecord | Event]) -> None: ...

    def log_series(self, series: dict[str, list[tuple[float, float]]]) -> None: ...

    def finish(self, artifacts: list[Path]) -> None: ...

    def describe(self) -> dict[str, Any]: ...  # run id, URL, log dir: for trackers.json


# The unit of the run whose records this worker thread sends (TrackerSink._run sets it).
_sending = threading.local()
TOKEN_FIELDS = ("tokens", "tokens_per_s")


def sending_unit(unit: str) -> None:
    """The throughput unit of the records this thread sends (scalars() reads it)."""
    _sending.unit = unit


def scalars(record: StepRecord) -> dict[str, float]:
    """Every numeric field of a step record but the step, rank and wall time, as train/<field>;
    for a samples model (Params.unit) without the token fields."""
    skip = ("step", "rank", "wall_time", "attempt")
    if getattr(_sending, "unit", "tokens") == "samples":
        skip += TOKEN_FIELDS
    fields = {
        f"train/{k}": float(v)
        for k, v in vars(record).items()
        # NaN in a field but the loss: not recorded (a script's session.log left it out)
        if k not in skip and isinstance(v, int | float) and (v == v or k == "loss")
    }
    return {f"train/{k}": float(v) for k, v in record.metrics.items()} | fields


def event_scalars(event: Event) -> dict[str, float]:
    """An eval event's metrics as eval/<name>; any other event as event/<name>/duration_s
    and its numeric attributes event/<name>/<attr>."""
    numeric = {
        k: float(v)
        for k, v in event.attrs.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    if event.name == "eval":
        return {f"eval/{k}": v for k, v in numeric.items()}
    prefix = f"event/{event.name}"
    return {f"{prefix}/duration_s": event.end - event.start} | {
        f"{prefix}/{k}": v for k, v in numeric.items()
    }


class TrackerSink:
    """A `Sink` that feeds one tracker from a background thread."""

    def __init__(
        self,
        tracker: Tracker,
        params: Params,
        queue_size: int,
        batch_size: int,
        close_timeout_s: float,
        flush_interval_s: float = 0.0,
        spool: Spool | None = None,
        retry_interval_s: float = 10.0,
    ):
        self.tracker = tracker
        self.params = params
        self.batch_size = batch_size
        self.close_timeout_s = close_timeout_s
        self.flush_interval_s = flush_interval_s
        # Records the tracker could not take wait here (None: they are dropped); the worker
        # tries the tracker again at most every retry_interval_s while it is down.
        self.spool = spool
        self.retry_interval_s = retry_interval_s
        self.dropped = 0  # records not delivered: queue full, spool full or no spool
        self.error: str | None = None  # the first failure, as one line
        self.errors: dict[str, str] = {}  # each kind of failure, its first message
        self.unfinished = False  # the tracker's run could not be ended (spooled for later)
        self._next_try = 0.0  # monotonic time of the next try while the tracker is down
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._opened = False
        self._closed = False
        self._deadline: float | None = None  # monotonic time close() waits until
        self._thread = threading.Thread(
            target=self._run, name=f"tracker-{tracker.name}", daemon=True
        )
        self._thread.start()

    # -- the training thread ------------------------------------------------------------
    def write_step(self, record: StepRecord) -> None:
        self._put(record)

    def write_event(self, event: Event) -> None:
        self._put(event)

    def _put(self, item: StepRecord | Event) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._count_dropped(1)

    def request_stop(self) -> None:
        """Tell the worker to finish what is queued and end (returns at once unless the queue
        is full); close() then waits. Several sinks' close timeouts can so run side by side."""
        if self._deadline is not None:
            return
        self._deadline = time.monotonic() + self.close_timeout_s
        while True:  # the sentinel must get in, even behind a full queue
            try:
                self._queue.put(_STOP, timeout=0.1)
                return
            except queue.Full:
                if time.monotonic() > self._deadline:
                    return

    def close(self) -> dict[str, Any]:
        """Stop the worker (after what is queued, within close_timeout_s of the stop request)
        and say once what was dropped. Returns the tracker's record for trackers.json."""
        if not self._closed:
            self._closed = True
            self.request_stop()
            deadline = self._deadline or time.monotonic()
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                self._fail(f"did not finish within {self.close_timeout_s:g} s")
                self._count_dropped(self._queue.qsize())
            if self.dropped:
                log.warning(
                    "tracking: %s dropped %d record(s)%s",
                    self.tracker.name,
                    self.dropped,
                    f" ({self.error})" if self.error else "",
                )
            if self.spool is not None and self.spool.count:
                log.warning(
                    "tracking: %s kept %d record(s)%s in %s: sent when it answers again "
                    "(the next attempt) or by `toolkit track sync %s --tracker %s`",
                    self.tracker.name,
                    self.spool.count,
                    " and the end of its run" if self.unfinished else "",
                    self.spool.path,
                    self.spool.path.parent.parent,
                    self.tracker.name,
                )
        return self.record()

    @property
    def opened(self) -> bool:
        """The worker has started its tracker."""
        return self._opened

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dropped": self.dropped, "error": self.error}
        out["errors"] = list(self.errors.values())
        out["spooled"] = self.spool.count if self.spool is not None else 0
        out["unfinished"] = self.unfinished
        try:
            out.update(self.tracker.describe())
        except Exception as exc:  # noqa: BLE001 - describing must not fail the close
            out["describe_error"] = str(exc)
        return out

    # -- the worker thread --------------------------------------------------------------
    def _count_dropped(self, n: int) -> None:
        with self._lock:
            self.dropped += n

    def _fail(self, message: str, exc: BaseException | None = None) -> None:
        """Say a failure once per kind (what failed, and the exception's type): a server
        that goes down, comes back and then refuses a record is three warnings, not one."""
        kind = message.split(":")[0] + (f" {type(exc).__name__}" if exc is not None else "")
        text = f"{message}: {_one_line(exc)}" if exc is not None else message
        with self._lock:
            if self.error is None:
                self.error = text
            new = kind not in self.errors
            if new:
                self.errors[kind] = text
        if new:
            log.warning("tracking: %s: %s (training goes on)", self.tracker.name, text)

    def _run(self) -> None:
        sending_unit(self.params.unit)  # scalars() of this thread's records
        self._open()
        while True:
            batch, stop = self._next_batch()
            if batch:
                self._send(batch)
            if stop:
                break
        if self.spool is not None and self.spool.count:
            self._next_try = 0.0  # one more try at the end: the server may be back
            self._send([])
        if self._opened and self.params.node_series is not None:
            try:
                self.tracker.log_series(self.params.node_series())
            except Exception as exc:  # noqa: BLE001
                self._fail("could not log node series", exc)
        self.unfinished = True
        if self._opened:
            try:
                self.tracker.finish([p for p in self.params.artifacts if p.exists()])
                self.unfinished = False
            except Exception as exc:  # noqa: BLE001
                self._fail("could not finish", exc)
        if self.unfinished and self.spool is not None:
            try:
                self.spool.mark_unfinished()
            except OSError as exc:
                self._fail("could not spool", exc)

    def _open(self) -> bool:
        self._next_try = time.monotonic() + self.retry_interval_s
        try:
            self.tracker.open(self.params)
            self._opened = True
        except Exception as exc:  # noqa: BLE001 - a tracker that cannot start is tried again
            self._fail("could not start", exc)
        return self._opened

    def _next_batch(self) -> tuple[list[StepRecord | Event], bool]:
        """What arrived within flush_interval_s of the first record (at most batch_size):
        one request per interval, not one per step."""
        first = self._queue.get()
        if first is _STOP:
            return [], True
        batch = [first]
        deadline = time.monotonic() + self.flush_interval_s
        while len(batch) < self.batch_size:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)
        return batch, False

    def _send(self, batch: list[StepRecord | Event]) -> None:
        """Send what the spool holds, then `batch`; while the tracker is down (not yet time
        to try again, or the try fails) `batch` goes to the spool."""
        down = time.monotonic() < self._next_try
        if (down or not self._opened) and self.spool is None and not self._opened:
            self._count_dropped(len(batch))
            return
        if not self._opened and (down or not self._open()):
            self._keep(batch)
            return
        if down and self.spool is not None and self.spool.count:
            self._keep(batch)
            return
        try:
            if self.spool is not None and self.spool.count:
                spooled, _unfinished = self.spool.read()  # the run goes on: not ended here
                for i in range(0, len(spooled), self.batch_size):
                    self.tracker.log(spooled[i : i + self.batch_size])
                self.spool.clear()
            if batch:
                self.tracker.log(batch)
        except Exception as exc:  # noqa: BLE001 - the server may come back: keep trying
            self._next_try = time.monotonic() + self.retry_interval_s
            self._fail("logging failed", exc)
            self._keep(batch)

    def _keep(self, batch: list[StepRecord | Event]) -> None:
        """`batch` into the spool (what does not fit is dropped and counted)."""
        if self.spool is None:
            self._count_dropped(len(batch))
            return
        try:
            self._count_dropped(self.spool.add(batch))
        except OSError as exc:
            self._count_dropped(len(batch))
            self._fail("could not spool", exc)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
