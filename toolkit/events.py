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
    # The job attempt that wrote the record: 0, then one more per resume after a crash or a
    # requeue (JsonlSink stamps it). Readers keep the last attempt's record of a step:
    # last_attempt().
    attempt: int = 0
    # Your own series at this step (a callback's `metrics`, session.log's other names): in
    # the JSON line beside the fields, in the report and the trackers as train/<name>.
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Event:
    name: str  # checkpoint | preemption | restart | eval | ...
    start: float  # time.time()
    end: float
    step: int
    rank: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)
    attempt: int = 0  # as StepRecord.attempt


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
    """One JSON object per line: <dir>/rank<k>.jsonl (steps) and events-rank<k>.jsonl, each
    with this writer's attempt (`next_attempt`; `restart_count`: the job's, Slurm's)."""

    def __init__(self, directory: Path, rank: int, restart_count: int = 0):
        directory.mkdir(parents=True, exist_ok=True)
        steps, events = directory / f"rank{rank}.jsonl", directory / f"events-rank{rank}.jsonl"
        self.attempt = next_attempt([steps, events], restart_count)
        self._steps = open(steps, "a", buffering=1)  # noqa: SIM115
        self._events = open(events, "a", buffering=1)  # noqa: SIM115

    def write_step(self, record: StepRecord) -> None:
        line = step_line(record) | {"attempt": self.attempt}
        self._steps.write(json.dumps(line) + "\n")

    def write_event(self, event: Event) -> None:
        line = dataclasses.asdict(event) | {"attempt": self.attempt}
        self._events.write(json.dumps(line) + "\n")

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


STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(StepRecord)) - {"metrics"}
EVENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Event))
_REQUIRED = [
    f.name
    for f in dataclasses.fields(StepRecord)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
]
_FLOAT_FIELDS = frozenset(f.name for f in dataclasses.fields(StepRecord) if f.type == "float")


def step_line(record: StepRecord) -> dict[str, Any]:
    """A step record as its JSON line: the fields, then its own series under their names
    (a series named like a field is left out: the field is the record's)."""
    line = {k: v for k, v in dataclasses.asdict(record).items() if k != "metrics"}
    return line | {k: v for k, v in record.metrics.items() if k not in line}


def step_from_line(line: dict[str, Any]) -> StepRecord:
    """A JSON line of rank<k>.jsonl back as a StepRecord: its other numeric names are its
    series (`metrics`). Plain data only; nothing in it is imported or called."""
    fields = {k: v for k, v in line.items() if k in STEP_FIELDS}
    # A field the line lacks (a script's session.log records only what it was given): NaN,
    # "not recorded", which the trackers leave out; a count, 0.
    fields = {k: 0 for k in _REQUIRED} | dict.fromkeys(_FLOAT_FIELDS, math.nan) | fields
    series = {
        k: float(v)
        for k, v in line.items()
        if k not in STEP_FIELDS and isinstance(v, int | float) and not isinstance(v, bool)
    }
    return StepRecord(**fields, metrics=series)


def event_from_line(line: dict[str, Any]) -> Event:
    """A JSON line of events-rank<k>.jsonl back as an Event."""
    return Event(**{k: v for k, v in line.items() if k in EVENT_FIELDS})


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics or events JSON-lines file that a reader can use: objects
    with a whole step; a line cut by a crash or of another shape is passed over. [] when
    the file is absent."""
    out = []
    try:
        f = open(path, errors="replace")  # noqa: SIM115 - closed below
    except OSError:
        return []
    with f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                out.append(record)
    return out


def read_steps(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def next_attempt(paths: list[Path], restart_count: int = 0) -> int:
    """The attempt of a writer that appends to `paths`: the job's restart count, or one past
    the last attempt recorded there when that is higher (a local run resumed into the same
    run dir has no restart count of its own). Only each file's last line is read."""
    recorded = [_last_line_attempt(p) for p in paths]
    return max([restart_count] + [a + 1 for a in recorded if a is not None])


def _last_line_attempt(path: Path, tail_bytes: int = 1 << 16) -> int | None:
    """The attempt of the last complete record in `path` (0 for a record from before the
    field existed), None when the file holds none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash, or the first one cut by the tail
        if isinstance(record, dict):
            attempt = record.get("attempt", 0)
            return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0
    return None


def last_attempt_rows(steps: list[int], attempts: list[int]) -> list[int]:
    """The rows that are the last attempt's record of their step, in step order.

    An attempt resumed from a checkpoint repeats the steps after it: from its first step
    on, the earlier attempts' records are superseded (also steps the later attempt has not
    reached yet, as TensorBoard's purge does). Of two rows of one attempt and step, the
    later one is kept. Every reader of step records goes through here (`last_attempt`)."""
    order = sorted(range(len(steps)), key=lambda i: (attempts[i], i))
    first: dict[int, int] = {}
    for i in order:
        first[attempts[i]] = min(first.get(attempts[i], steps[i]), steps[i])
    # Per attempt, the lowest first step of any later attempt (where it stops counting).
    until: dict[int, float] = {}
    bound = math.inf
    for attempt in sorted(first, reverse=True):
        until[attempt] = bound
        bound = min(bound, first[attempt])
    kept: dict[int, int] = {}
    for i in order:
        if steps[i] < until[attempts[i]]:
            kept[steps[i]] = i
    return [kept[s] for s in sorted(kept)]


def last_attempt(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step records (JSON objects, one rank's or several ranks') with only the last
    attempt's record of each step per rank, in (rank, step) order; a record without an
    `attempt` is attempt 0."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_rank.setdefault(int(r.get("rank", 0)), []).append(r)
    out = []
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        keep = last_attempt_rows(
            [int(r["step"]) for r in rows], [int(r.get("attempt", 0)) for r in rows]
        )
        out += [rows[i] for i in keep]
    return out
