"""The trackers a run asked for, as one sink on rank 0 (none elsewhere), and the record of
them in RUN_DIR/tracking/trackers.json."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolkit.config.tracking import TrackingConfig
from toolkit.events import Event, Fanout, Sink
from toolkit.files import write_private
from toolkit.redact import redact, redact_text
from toolkit.tracking.base import Params, Tracker, TrackerSink
from toolkit.tracking.spool import Spool, spool_path

log = logging.getLogger(__name__)

TRACKERS_FILE = "tracking/trackers.json"


def build_tracker(name: str, cfg: TrackingConfig, run_dir: Path) -> Tracker:
    if name == "tensorboard":
        from toolkit.tracking.tensorboard import TensorBoardTracker

        return TensorBoardTracker(run_dir / "tracking" / "tensorboard")
    if name == "mlflow":
        from toolkit.tracking.mlflow import MlflowTracker

        return MlflowTracker(cfg, run_dir)
    from toolkit.tracking.wandb import WandbTracker

    return WandbTracker(cfg, run_dir)


class Trackers(Fanout):
    """Every tracker of the run as one sink; close() also writes trackers.json."""

    def __init__(self, sinks: list[TrackerSink], run_dir: Path):
        super().__init__(sinks)
        self.trackers = sinks
        self.run_dir = run_dir

    def close(self) -> None:
        for s in self.trackers:  # stop them all first, then wait: the timeouts run side by side
            s.request_stop()
        records = {s.tracker.name: s.close() for s in self.trackers}
        write_private(self.run_dir / TRACKERS_FILE, json.dumps(redact(records), indent=2))


def build_tracking_sinks(
    cfg: TrackingConfig,
    is_rank0: bool,
    run_dir: Path,
    config: dict[str, Any],
    node_series: Callable[[], dict[str, list[tuple[float, float]]]] | None = None,
    action: str | None = None,
    unit: str = "tokens",
) -> list[Sink]:
    """Rank 0's trackers (none on the other ranks, none when tracking=none). `config` is the
    job as a nested dict: it is redacted here, flattened, and logged as parameters;
    `node_series`, called at the end, gives the node telemetry series to send; `action`:
    see unsent_hangs; `unit`: the model's throughput unit (a samples model's records go
    without tokens/s)."""
    if not is_rank0 or not cfg.backends:
        return []
    params = run_params(cfg, run_dir, config, unit)
    params.node_series = node_series if cfg.node_series else None
    sinks = [
        TrackerSink(
            build_tracker(name, cfg, run_dir),
            params,
            cfg.queue_size,
            cfg.batch_size,
            cfg.close_timeout_s,
            cfg.flush_interval_s,
            tracker_spool(cfg, run_dir, name),
            cfg.retry_interval_s,
        )
        for name in cfg.backends
    ]
    trackers = Trackers(sinks, run_dir)
    for event in unsent_hangs(run_dir, action):  # a hang ended the previous attempt: say so now
        trackers.write_event(event)
    return [trackers]


def run_params(cfg: TrackingConfig, run_dir: Path, config: dict[str, Any], unit: str) -> Params:
    """What a tracker records about the run: `config` (the job as a nested dict) redacted
    and flattened, the launch overrides, the files uploaded at the end."""
    return Params(
        config=flatten(redact(config)),
        overrides=launch_overrides(run_dir),
        run_name=cfg.run_name or run_dir.name,
        artifacts=[
            run_dir / "summary.json",
            run_dir / "metrics" / "events-rank0.jsonl",
            run_dir / "telemetry" / "report" / "report.html",
        ],
        unit=unit,
    )


def tracker_spool(cfg: TrackingConfig, run_dir: Path, name: str) -> Spool | None:
    """Where tracker `name` keeps what it missed (None: tracking.spool_max_records=0)."""
    if cfg.spool_max_records <= 0:
        return None
    return Spool(spool_path(run_dir, name), cfg.spool_max_records)


HANGS_SENT = "tracking/hangs_sent.json"  # the hang dumps already sent to the trackers


def unsent_hangs(run_dir: Path, action: str | None = None) -> list[Event]:
    """A `hang` event for each hang dump of the run (RUN_DIR/hangs/<time>/summary.json) not
    yet sent: the node agent that caught it ended the job before any tracker could hear of
    it, so the next attempt's rank 0 sends it (and records that it did). Its attributes name
    the dump's directory and the stuck ranks; `action`: what was done about a hang whose
    summary still says "pending" (the after-hang action sends it before it is written)."""
    ledger = run_dir / HANGS_SENT
    sent = _sent(run_dir)
    events = []
    for path, summary in _summaries(run_dir):
        key = path.parent.name
        if key in sent:
            continue
        when = path.stat().st_mtime
        attrs = {k: v for k, v in summary.items() if isinstance(v, str | int | float)}
        attrs["dump"] = str(path.parent)
        attrs["stuck_ranks"] = ",".join(map(str, summary["stuck_ranks"]))
        attrs["stuck_hosts"] = ",".join(map(str, summary["stuck_hosts"]))
        if action is not None and attrs.get("action") in (None, "pending"):
            attrs["action"] = action
        events.append(Event("hang", when, when, int(summary["step"]), 0, attrs))
        sent.add(key)
    if events:
        ledger.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        ledger.write_text(json.dumps(sorted(sent)))
    return events


def send_final_hangs(
    cfg: TrackingConfig, run_dir: Path, config: dict[str, Any], action: str | None = None
) -> int:
    """A hang that ends the run for good (a local run; the last attempt Slurm may requeue)
    has no next attempt to send it: whoever ends the run opens the run's trackers, sends each
    hang dump not yet sent (the same ledger: a later relaunch does not send it again) and
    closes them, within tracking.close_timeout_s. Returns how many were sent."""
    sent_before = _sent(run_dir)
    if not cfg.backends or all(p.parent.name in sent_before for p, _ in _summaries(run_dir)):
        return 0
    for trackers in build_tracking_sinks(cfg, True, run_dir, config, action=action):
        trackers.close()
    return len(_sent(run_dir) - sent_before)


def _sent(run_dir: Path) -> set[str]:
    try:
        return set(json.loads((run_dir / HANGS_SENT).read_text()))
    except (OSError, ValueError):
        return set()


def _summaries(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    from toolkit.fault.hang import hang_summaries

    return hang_summaries(run_dir)


def launch_overrides(run_dir: Path) -> list[str]:
    """The command line's overrides as the launcher recorded them (already redacted)."""
    from omegaconf import OmegaConf

    path = run_dir / "launch.yaml"
    if not path.is_file():  # a job built by hand, not by the launcher
        return []
    return [redact_text(str(o)) for o in OmegaConf.load(path).overrides]


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {"a.b.c": leaf}."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): tree}


def read_trackers(run_dir: Path) -> dict[str, Any]:
    """What RUN_DIR/tracking/trackers.json says about each tracker ({} when none ran)."""
    path = run_dir / TRACKERS_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}


def tracker_links(run_dir: Path) -> dict[str, str]:
    """Where each tracker of a run shows it: the run's URL (MLflow on a server, W&B online),
    else its id and store, else its files; {} when the run used none."""
    links = {}
    for name, record in read_trackers(run_dir).items():
        if record.get("url"):
            links[name] = record["url"]
        elif name == "mlflow" and record.get("run_id"):
            links[name] = f"run {record['run_id']} at {record['tracking_uri']}"
        elif record.get("logdir") or record.get("dir"):
            links[name] = record.get("logdir") or record["dir"]
        else:
            links[name] = f"not started ({record.get('error')})"
        if record.get("dropped"):
            links[name] += f" ({record['dropped']} record(s) dropped)"
        if record.get("spooled") or record.get("unfinished"):
            ended = ", its run not ended" if record.get("unfinished") else ""
            links[name] += (
                f" ({record.get('spooled') or 0} record(s) waiting{ended}: "
                f"toolkit track sync {run_dir} --tracker {name})"
            )
    return links
