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

`take()` returns and resets the sums: the loop calls it once per step. Pure bookkeeping;
installing is reversible (`uninstall`) and idempotent per process.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

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


class CommTimer:
    def __init__(self) -> None:
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
        exposed, self.exposed_s = self.exposed_s, 0.0
        return busy, exposed

    def _add(self, kind: str, seconds: float) -> None:
        self._done.append((kind, seconds))

    def _wrap_wait(self, original: Any) -> Any:
        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or self._depth:
                return original(work, *args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(work, *args, **kwargs)
            finally:
                self.exposed_s += time.perf_counter() - t0

        return wait

    def _wrap(self, original: Any, name: str, kind: str) -> Any:
        is_async = name in ASYNC_ALWAYS

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or self._depth:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            self._depth += 1
            try:
                work = original(*args, **kwargs)
            finally:
                self._depth -= 1
            if work is None or not (is_async or kwargs.get("async_op")):
                elapsed = time.perf_counter() - t0
                self._add(kind, elapsed)
                self.exposed_s += elapsed
                return work
            works = work if isinstance(work, list) else [work]  # batch_isend_irecv: a list
            try:
                future = torch.futures.collect_all([w.get_future() for w in works])
                future.add_done_callback(lambda _f: self._add(kind, time.perf_counter() - t0))
            except (RuntimeError, AttributeError):  # no future on this backend: time the wait
                self._add(kind, time.perf_counter() - t0)
            return work

        return timed
