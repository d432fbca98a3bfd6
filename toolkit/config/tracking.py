"""Experiment trackers (owned by toolkit/tracking/; see docs/tracking.md): TensorBoard,
MLflow and Weights & Biases, each on or off. Rank 0 sends them the step records, eval
metrics and events; every tracker runs behind a bounded queue on its own thread.

Secrets (MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN, WANDB_API_KEY) come from the
environment only: this group has no field for them, and a password in the tracking URI is
refused."""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.config.errors import below_minimum, not_one_of

WANDB_MODES = ("offline", "online", "disabled")
_URL_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*:[^/@]*@")


@dataclass
class TrackingConfig:
    # One flag per tracker, so that `tracking=[tensorboard,mlflow]` merges the options.
    tensorboard: bool = False  # event files under RUN_DIR/tracking/tensorboard
    mlflow: bool = False  # a run on the MLflow tracking server
    wandb: bool = False  # a W&B run (offline by default: files under RUN_DIR/tracking/wandb)
    experiment: str = "toolkit"  # MLflow experiment; W&B project unless wandb_project is set
    run_name: str | None = None  # the tracker's run name (default: the run dir's name)
    mlflow_tracking_uri: str | None = (
        None  # else MLFLOW_TRACKING_URI, else RUN_DIR/tracking/mlflow.db
    )
    mlflow_request_timeout_s: float = 10.0  # per HTTP request to the server
    mlflow_request_retries: int = 1  # MLflow's own retries per request (each with backoff)
    wandb_mode: str = "offline"  # offline | online | disabled; online needs WANDB_API_KEY
    wandb_project: str | None = None
    wandb_entity: str | None = None
    # At the end, from the node telemetry files: host CPU and memory, GPU utilisation,
    # memory and power per node (needs telemetry on).
    node_series: bool = True
    queue_size: int = 10000  # records buffered per tracker; beyond, dropped and counted
    batch_size: int = 200  # records the worker sends in one request at most
    flush_interval_s: float = 1.0  # the worker collects records this long per request
    close_timeout_s: float = 30.0  # how long the end of the run waits for each tracker
    # While a tracker is down, what it misses waits in RUN_DIR/tracking/spool-<tracker>.jsonl
    # (at most spool_max_records; beyond, dropped and counted) and is sent when it answers
    # again; it is tried again at most every retry_interval_s. 0: no spool (dropped).
    spool_max_records: int = 100000
    retry_interval_s: float = 10.0

    @property
    def backends(self) -> list[str]:
        return [b for b in ("tensorboard", "mlflow", "wandb") if getattr(self, b)]


def problems(cfg: TrackingConfig) -> list[str]:
    """Problems with the tracking group, one line each."""
    p = not_one_of("tracking", cfg, {"wandb_mode": WANDB_MODES})
    p += below_minimum("tracking", cfg, {"queue_size": 1, "batch_size": 1})
    p += below_minimum("tracking", cfg, {"mlflow_request_retries": 0, "close_timeout_s": 0})
    p += below_minimum("tracking", cfg, {"spool_max_records": 0, "retry_interval_s": 0})
    if not 0 <= cfg.flush_interval_s <= 60:
        p.append(f"tracking.flush_interval_s={cfg.flush_interval_s}: must be in [0, 60] seconds")
    if cfg.mlflow_request_timeout_s <= 0:
        p.append(f"tracking.mlflow_request_timeout_s={cfg.mlflow_request_timeout_s}: must be > 0")
    if cfg.mlflow_tracking_uri and _URL_PASSWORD.match(cfg.mlflow_tracking_uri):
        p.append(
            "tracking.mlflow_tracking_uri: holds a password; put it in MLFLOW_TRACKING_PASSWORD "
            "(and the user in MLFLOW_TRACKING_USERNAME) in the environment, never in a config"
        )
    return p
