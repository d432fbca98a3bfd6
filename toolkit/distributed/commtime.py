"""Time spent in collectives, per kind, and the part the training thread waited for.

FSDP2 and the loop call `torch.distributed.<collective>` through the module attribute, so
wrapping those attributes sees every collective of the training thread (other threads,
such as the checkpoint writer, pass through untimed):

* a synchronous call blocks the thread: its duration is both time in the collective and
  exposed time;
* an asynchronous call returns a work object: its completion is timed by a callback on the
  work's future (gloo: when the transfer is done; NCCL: when the stream work is done), and
  the time the thread spends in `Work.wait()` is the exposed part (wrapped on the class:
  FSDP2 checks `isinstance(work, Work)`, so a proxy object would not do).

On CUDA (`CommTimer(cuda=True)`) the time in each collective is taken from a pair of
`torch.cuda.Event(enable_timing=True)` recorded on the stream the collective is issued
from (FSDP2 issues its all-gathers and reduce-scatters from its own streams): the start
before the call, the end after it for a synchronous call (the issuing stream then waits for
the collective) or after `Work.wait()` for an asynchronous one. The events are resolved in
`take()`, at the step boundary where the loop has already synchronised the device; an
event pair not yet complete is kept for the next step, so nothing here synchronises.
The exposed part stays what the training thread waited for on the host. NOT RUN ON A GPU
YET (no device lent to this project so far): only the bookkeeping is tested, on CPU, with a
stand-in event class. (torch 2.13's `Work._get_duration()` and
`torch.distributed._time_estimator` would time NCCL work too, but both are private, and the
first needs TORCH_NCCL_ENABLE_TIMING=1: not used.)

Collectives that do not go through `torch.distributed.<name>` (DTensor's functional
collectives, e.g. the all-reduce of `full_tensor()` in gradient clipping) are timed by the
caller with `span(kind)`.

`take()` returns and resets the sums: the loop calls it once per step. Pure bookkeeping;
installing is reversible (`uninstall`) and idempotent per process.

With a `progress` object (toolkit.telemetry.heartbeat.Heartbeat: enter/block/leave), the
same wrappers also record which collective the training thread last entered and which one
it is blocked in (the call itself, or `Work.wait()` on an earlier async one), numbered in
the order the thread issued them: what the hang watchdog reads. `timing=False` keeps only
that record (telemetry.comm_timing=false with the watchdog on).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "p2p")
WRAPPED = {
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_reduce": "all_reduce",
    "broadcast": "p2p",
    "send": "p2p",
    "recv": "p2p",
    # Not isend/irecv themselves: torch.distributed.P2POp accepts only the originals (by
    # identity), and the pipeline schedules post their P2POps through batch_isend_irecv.
    "batch_isend_irecv": "p2p",
}
ASYNC_ALWAYS = ("batch_isend_irecv",)
MAX_TRACKED_WORKS = 4096  # async works never waited on are forgotten past this many


class Progress(Protocol):
    def enter(self, op: str) -> int: ...
    def block(self, seq: int, op: str) -> None: ...
    def leave(self) -> None: ...


def op_name(name: str, kind: str) -> str:
    """The op a hang report names: the kind for collectives, the call for p2p."""
    return name if kind == "p2p" else kind


def cuda_event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


class CommTimer:
    def __init__(
        self,
        progress: Progress | None = None,
        timing: bool = True,
        cuda: bool = False,
        event: Callable[[], Any] | None = None,
    ) -> None:
        """progress: the hang watchdog's record of the collective in flight; timing=False
        keeps only that. cuda: time collectives with CUDA events (`event` makes one: a
        stand-in in tests)."""
        self.progress = progress
        self.timing = timing
        self._works: dict[int, tuple[int, str]] = {}  # id(work) -> (seq, op), until waited
        self._event = (event or cuda_event) if cuda and timing else None
        self._pending: list[tuple[str, Any, Any]] = []  # (kind, start, end) event pairs
        self._open: dict[int, tuple[Any, str, Any]] = {}  # id(work) -> (work, kind, start)
        self.exposed_s = 0.0
        self._originals: dict[str, Any] = {}
        self._thread = threading.get_ident()
        self._done: list[
            tuple[str, float]
        ] = []  # appended from any thread (atomic), drained by take()
        self._depth = 0  # > 0 inside a wrapped call: its own internal wait() is not counted

    def install(self) -> CommTimer:
        self._thread = threading.get_ident()  # the training thread
        work_class = dist.distributed_c10d.Work
        if "Work.wait" not in self._originals:
            self._originals["Work.wait"] = work_class.wait
            work_class.wait = self._wrap_wait(work_class.wait)
        for name, kind in WRAPPED.items():
            original = getattr(dist, name, None)
            if original is None or name in self._originals:
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(original, name, kind))
        return self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            if name == "Work.wait":
                dist.distributed_c10d.Work.wait = original
            else:
                setattr(dist, name, original)
        self._originals.clear()

    def take(self) -> tuple[dict[str, float], float]:
        """(seconds in collectives per kind, exposed seconds) since the last take()."""
        busy = dict.fromkeys(KINDS, 0.0)
        done, self._done = self._done, []
        for kind, seconds in done:
            busy[kind] += seconds
        pending, self._pending = self._pending, []
        for kind, start, end in pending:
            if end.query():  # complete: the loop synchronised the device before take()
                busy[kind] += start.elapsed_time(end) / 1000.0  # ms
            else:
                self._pending.append((kind, start, end))
        self._open.clear()  # a work never waited for on this thread: not timed
        exposed, self.exposed_s = self.exposed_s, 0.0
        return busy, exposed

    @contextlib.contextmanager
    def span(self, kind: str) -> Iterator[None]:
        """Time a blocking collective the wrappers do not see (a DTensor functional
        collective): busy and exposed on the host, busy from events on CUDA."""
        if threading.get_ident() != self._thread or self._depth:
            yield
            return
        progress = self.progress
        if progress is not None:
            progress.enter(kind)
        start = self._record()
        t0 = time.perf_counter()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if progress is not None:
                progress.leave()
            elapsed = time.perf_counter() - t0
            if self.timing:
                self.exposed_s += elapsed
            if start is None:
                self._add(kind, elapsed)
            else:
                self._pending.append((kind, start, self._record()))

    def _record(self) -> Any:
        """A CUDA event recorded on the current stream now (None on CPU)."""
        if self._event is None:
            return None
        event = self._event()
        event.record()
        return event

    def _add(self, kind: str, seconds: float) -> None:
        if self.timing:
            self._done.append((kind, seconds))

    def _wrap_wait(self, original: Any) -> Any:
        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or self._depth:
                return original(work, *args, **kwargs)
            progress = self.progress
            if progress is not None:
                seq, op = self._works.pop(id(work), (0, "other"))
                progress.block(seq, op)
            t0 = time.perf_counter()
            try:
                return original(work, *args, **kwargs)
            finally:
                if self.timing:
                    self.exposed_s += time.perf_counter() - t0
                opened = self._open.pop(id(work), None)
                if opened is not None:  # CUDA: the current stream now waits for it
                    self._pending.append((opened[1], opened[2], self._record()))
                if progress is not None:
                    progress.leave()

        return wait

    def _wrap(self, original: Any, name: str, kind: str) -> Any:
        is_async = name in ASYNC_ALWAYS
        op = op_name(name, kind)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or self._depth:
                return original(*args, **kwargs)
            progress = self.progress
            seq = progress.enter(op) if progress is not None else 0
            start = self._record()
            t0 = time.perf_counter()
            self._depth += 1
            try:
                work = original(*args, **kwargs)
            finally:
                self._depth -= 1
                if progress is not None:
                    progress.leave()
            if work is None or not (is_async or kwargs.get("async_op")):
                elapsed = time.perf_counter() - t0
                if self.timing:
                    self.exposed_s += elapsed
                if start is None:
                    self._add(kind, elapsed)
                else:  # the issuing stream waits for the collective: end there
                    self._pending.append((kind, start, self._record()))
                return work
            if progress is not None:
                if len(self._works) >= MAX_TRACKED_WORKS:
                    self._works.clear()
                self._works[id(work)] = (seq, op)
            if not self.timing:
                return work
            if start is not None:
                self._open[id(work)] = (work, kind, start)  # ended after Work.wait()
                return work
            works = work if isinstance(work, list) else [work]  # batch_isend_irecv: a list
            try:
                future = torch.futures.collect_all([w.get_future() for w in works])
                future.add_done_callback(lambda _f: self._add(kind, time.perf_counter() - t0))
            except (RuntimeError, AttributeError):  # no future on this backend: time the wait
                self._add(kind, time.perf_counter() - t0)
            return work

        return timed
