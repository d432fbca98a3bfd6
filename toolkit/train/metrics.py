"""Per-step records and the sinks they go to.

Every sink implements the small `Sink` protocol. The training loop writes to one sink;
`Fanout` sends to several, `NullSink` is for ranks that do not write. Callers never branch
on rank: the composition root picks the sinks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass
class StepRecord:
    step: int  # 1-based count of optimizer steps done
    wall_time: float  # time.time() at the end of the step
    step_time_s: float
    data_wait_s: float
    forward_backward_s: float  # compute until gradients are ready (host-side timing)
    optimizer_s: float
    loss: float  # mean over all ranks and micro-batches
    grad_norm: float
    lr: float
    tokens: int  # tokens in this step, all ranks
    tokens_per_s: float
    mfu: float
    mem_peak_bytes: int
    rank: int = 0


@dataclass
class Event:
    name: str  # checkpoint | preemption | restart | eval | ...
    start: float  # time.time()
    end: float
    step: int
    rank: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)


class Sink(Protocol):
    def write_step(self, record: StepRecord) -> None: ...

    def write_event(self, event: Event) -> None: ...

    def close(self) -> None: ...


class NullSink:
    def write_step(self, record: StepRecord) -> None:
        pass

    def write_event(self, event: Event) -> None:
        pass

    def close(self) -> None:
        pass


class Fanout:
    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks

    def write_step(self, record: StepRecord) -> None:
        for s in self.sinks:
            s.write_step(record)

    def write_event(self, event: Event) -> None:
        for s in self.sinks:
            s.write_event(event)

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - one sink failing must not hide the others
                log.exception("closing metrics sink %s failed", type(s).__name__)


class JsonlSink:
    """One JSON object per line: <dir>/rank<k>.jsonl (steps) and events-rank<k>.jsonl."""

    def __init__(self, directory: Path, rank: int):
        directory.mkdir(parents=True, exist_ok=True)
        self._steps = open(directory / f"rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115
        self._events = open(directory / f"events-rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115

    def write_step(self, record: StepRecord) -> None:
        self._steps.write(json.dumps(dataclasses.asdict(record)) + "\n")

    def write_event(self, event: Event) -> None:
        self._events.write(json.dumps(dataclasses.asdict(event)) + "\n")

    def close(self) -> None:
        self._steps.close()
        self._events.close()


def read_steps(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class ConsoleSink:
    """Progress on rank 0: a rich progress bar on a terminal, plain log lines otherwise."""

    def __init__(self, total_steps: int, start_step: int, log_every: int, progress: bool = True):
        self.total = total_steps
        self.log_every = max(1, log_every)
        self._progress = None
        if progress and sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(
                    "loss {task.fields[loss]}  {task.fields[tps]} tok/s  MFU {task.fields[mfu]}"
                ),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self._task = self._progress.add_task(
                "train", total=total_steps, completed=start_step, loss="-", tps="-", mfu="-"
            )
            self._progress.start()

    def write_step(self, r: StepRecord) -> None:
        if self._progress is not None:
            self._progress.update(
                self._task,
                completed=r.step,
                loss=f"{r.loss:.4f}",
                tps=f"{r.tokens_per_s:,.0f}",
                mfu=f"{100 * r.mfu:.2f}%",
            )
        if r.step % self.log_every == 0 or r.step == self.total:
            remaining = (self.total - r.step) * r.step_time_s
            msg = (
                f"step {r.step}/{self.total}  loss {r.loss:.4f}  grad_norm {r.grad_norm:.3f}  "
                f"lr {r.lr:.2e}  {r.tokens_per_s:,.0f} tok/s  MFU {100 * r.mfu:.2f}%  "
                f"step {1000 * r.step_time_s:.0f} ms  ETA {remaining:.0f} s"
            )
            if self._progress is not None:
                self._progress.console.log(msg)
            else:
                log.info(msg)

    def write_event(self, event: Event) -> None:
        log.info(
            "event %s at step %d (%.2f s) %s",
            event.name,
            event.step,
            event.end - event.start,
            event.attrs or "",
        )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
