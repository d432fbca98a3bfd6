"""`toolkit track sync RUN [--tracker NAME]`: a run's metrics into a tracker after the fact.

What the tracker missed (its spool, RUN_DIR/tracking/spool-<tracker>.jsonl) and every step
record it does not have (the last attempt's of each step, `toolkit.events.last_attempt`,
from metrics/rank0.jsonl, with the events of those steps) are sent to the run's tracker run
(the MLflow run in tracking/mlflow_run_id, TensorBoard's log dir, the W&B run id), or to a
new one when the run had none. A run that ended (summary.json) has its tracker run ended
too: an MLflow run left RUNNING because the server was down at the end is FINISHED.
Everything read from the run dir is plain data (YAML, JSON lines)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from toolkit.config.compose import job_to_dict, load_job
from toolkit.events import (
    Event,
    StepRecord,
    event_from_line,
    last_attempt,
    read_records,
    step_from_line,
)
from toolkit.files import write_private
from toolkit.redact import redact
from toolkit.runmodel import run_unit
from toolkit.tracking.base import Tracker, sending_unit
from toolkit.tracking.build import TRACKERS_FILE, build_tracker, read_trackers, run_params
from toolkit.tracking.spool import Spool, spool_path


@dataclass
class Synced:
    tracker: str
    steps: int  # step records sent
    events: int  # events sent
    finished: bool  # the tracker's run was ended
    where: dict  # the tracker's own description (run id, URL, log dir)


def sync_run(run_dir: Path, name: str) -> Synced:
    """Send tracker `name` what it lacks of the run in `run_dir` (see the module's text)."""
    job = load_job(run_dir / "config.yaml")
    cfg = job.tracking
    tracker = build_tracker(name, cfg, run_dir)
    params = run_params(cfg, run_dir, job_to_dict(job), run_unit(run_dir))
    sending_unit(params.unit)
    tracker.open(params)
    spool = Spool(spool_path(run_dir, name), max(1, cfg.spool_max_records))
    spooled, _unfinished = spool.read()
    steps = _records(last_attempt(read_records(run_dir / "metrics" / "rank0.jsonl")))
    missing = missing_steps(tracker, [s.step for s in steps])
    records = [s for s in steps if s.step in missing]
    events = [event_from_line(e) for e in read_records(run_dir / "metrics" / "events-rank0.jsonl")]
    wanted = {_key(e) for e in events if e.step in missing}
    wanted |= {_key(e) for e in spooled if isinstance(e, Event)}
    known = {_key(e) for e in events}
    sent_events = [e for e in events if _key(e) in wanted]
    sent_events += [e for e in spooled if isinstance(e, Event) and _key(e) not in known]
    items: list[StepRecord | Event] = sorted(
        [*records, *sent_events], key=lambda i: (i.step, isinstance(i, Event))
    )
    for i in range(0, len(items), cfg.batch_size):
        tracker.log(items[i : i + cfg.batch_size])
    ended = (run_dir / "summary.json").is_file()
    if ended:
        tracker.finish([p for p in params.artifacts if p.exists()])
    spool.clear()
    where = tracker.describe()
    _note(run_dir, name, where)
    return Synced(name, len(records), len(sent_events), ended, where)


def missing_steps(tracker: Tracker, steps: list[int]) -> set[int]:
    """The steps the tracker has no record of (every step when it cannot say)."""
    have = getattr(tracker, "missing_steps", None)
    return set(steps) if have is None else have(steps)


def _records(lines: list[dict]) -> list[StepRecord]:
    out = []
    for line in lines:
        try:
            out.append(step_from_line(line))
        except (TypeError, ValueError):
            continue  # not a step record of ours (a field missing or of another type)
    return out


def _key(event: Event) -> tuple[str, int, float]:
    return (event.name, event.step, event.start)


def _note(run_dir: Path, name: str, where: dict) -> None:
    """trackers.json: the tracker's run as synced (nothing left spooled, run ended)."""
    records = read_trackers(run_dir)
    records[name] = {**records.get(name, {}), **where, "spooled": 0, "unfinished": False}
    write_private(run_dir / TRACKERS_FILE, json.dumps(redact(records), indent=2))
