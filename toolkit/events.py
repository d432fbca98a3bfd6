"""The project-wide contract for what a run reports: step records, events, and the sinks
they go to.

The training loop produces `StepRecord`s and `Event`s; checkpointing and telemetry produce
events and consume both. All of them depend on this module, and it depends on none of them.
Every sink implements the small `Sink` protocol. `Fanout` sends to several, `NullSink` is
for ranks that do not write. Callers never branch on rank: the composition root picks the
sinks. `JsonlSink` writes the per-rank JSON-lines files that reports and benchmarks read
back with `read_steps`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
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
    mfu: float  # from the model's FLOPs per sample (analytic, or counted)
    mem_peak_bytes: int
    rank: int = 0
    # Where the step went (defaults keep older files readable). On every backend:
    # step_time_s = data_wait_s + compute_s + comm_exposed_s + optimizer_step_s
    #               + checkpoint_stall_s + other_s
    compute_s: float = 0.0  # forward/backward and clipping, minus communication waited for
    comm_exposed_s: float = 0.0  # the training thread blocked in collectives
    optimizer_step_s: float = 0.0  # optimizer.step, zero_grad and the schedule
    checkpoint_stall_s: float = 0.0  # hooks before the optimizer step (checkpoint staging)
    other_s: float = 0.0  # the rest of the step
    # Seconds in collectives per kind, from issue to completion (overlapped or not).
    comm_all_gather_s: float = 0.0
    comm_reduce_scatter_s: float = 0.0
    comm_all_reduce_s: float = 0.0
    comm_p2p_s: float = 0.0
    samples_per_s: float = 0.0  # sequences / samples per second, all ranks
    epoch: int = 0  # the data's epoch (0-based) of this step's samples (toolkit.data.loader)


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


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (NaN, inf) as None, so that json.dumps writes
    strict JSON (null, never a literal NaN that other readers refuse)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def read_steps(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
