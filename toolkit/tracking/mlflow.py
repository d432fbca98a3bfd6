"""MLflow: a run on a tracking server through MlflowClient (no global `mlflow.start_run`
state). The run id is kept in RUN_DIR/tracking/mlflow_run_id (0600), so a resumed or
requeued job continues the same run. Credentials come from the environment only
(MLFLOW_TRACKING_USERNAME/PASSWORD, MLFLOW_TRACKING_TOKEN), read by MLflow itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from toolkit.config.tracking import TrackingConfig
from toolkit.events import Event, StepRecord
from toolkit.files import write_private
from toolkit.redact import redact_text
from toolkit.tracking.base import Params, event_scalars, scalars

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
MAX_PARAMS_PER_BATCH = 100  # and on params per log_batch call


def tracking_uri(cfg: TrackingConfig, run_dir: Path) -> str:
    """tracking.mlflow_tracking_uri, else MLFLOW_TRACKING_URI, else a SQLite store in the run
    dir (`mlflow ui --backend-store-uri sqlite:///RUN_DIR/tracking/mlflow.db`)."""
    return cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri(run_dir)


def default_uri(run_dir: Path) -> str:
    """The SQLite store in the run dir, used when no tracking URI is given."""
    return f"sqlite:///{run_dir / 'tracking' / 'mlflow.db'}"


class MlflowTracker:
    name = "mlflow"

    def __init__(self, cfg: TrackingConfig, run_dir: Path):
        self.cfg = cfg
        self.uri = tracking_uri(cfg, run_dir)
        # With the store in the run dir, the artifacts go beside it: MLflow's default for a
        # new experiment is ./mlruns in whatever directory the rank was started from.
        local = self.uri == default_uri(run_dir)
        self.artifact_location = (run_dir / "tracking" / "mlartifacts").as_uri() if local else None
        self.id_file = run_dir / "tracking" / "mlflow_run_id"
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.resumed = False
        self._client: Any = None

    def open(self, params: Params) -> None:
        # MLflow reads these per request; its defaults (120 s, 7 retries with backoff) would
        # hold one batch for minutes when the server is down.
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(
            int(max(1, self.cfg.mlflow_request_timeout_s))
        )
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(self.cfg.mlflow_request_retries)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self.uri)
        if self.id_file.is_file():
            self.run_id = self.id_file.read_text().strip()
            run = self._client.get_run(self.run_id)
            self.experiment_id = run.info.experiment_id
            self._client.update_run(self.run_id, status="RUNNING")
            self.resumed = True
            logged = set(run.data.params)
        else:
            experiment = self._client.get_experiment_by_name(self.cfg.experiment)
            self.experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self._client.create_experiment(
                    self.cfg.experiment, artifact_location=self.artifact_location
                )
            )
            run = self._client.create_run(self.experiment_id, run_name=params.run_name)
            self.run_id = run.info.run_id
            write_private(self.id_file, self.run_id)
            logged = set()
        # Params cannot change once logged: a resumed run adds only the new keys.
        values = {**params.config, "launch.overrides": " ".join(params.overrides)}
        new = [
            Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in sorted(values.items()) if k not in logged
        ]
        for i in range(0, len(new), MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=new[i : i + MAX_PARAMS_PER_BATCH])

    def log(self, items: list[StepRecord | Event]) -> None:
        from mlflow.entities import Metric

        metrics = []
        for item in items:
            if isinstance(item, StepRecord):
                values, at = scalars(item), item.wall_time
            else:
                values, at = event_scalars(item), item.end
            metrics += [Metric(k, v, int(at * 1000), item.step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's limit per log_batch
            self._client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def missing_steps(self, steps: list[int]) -> set[int]:
        """Of `steps`, those the run has no train/loss of (toolkit track sync)."""
        have = {m.step for m in self._client.get_metric_history(self.run_id, "train/loss")}
        return {s for s in steps if s not in have}

    def log_series(self, series: dict[str, list[tuple[float, float]]]) -> None:
        from mlflow.entities import Metric

        metrics = [  # step: seconds since the series' first sample
            Metric(name, v, int(t * 1000), int(t - points[0][0]))
            for name, points in series.items()
            for t, v in points
        ]
        for i in range(0, len(metrics), 1000):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def finish(self, artifacts: list[Path]) -> None:
        for path in artifacts:
            self._client.log_artifact(self.run_id, str(path))
        self._client.set_terminated(self.run_id, status="FINISHED")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tracking_uri": redact_text(self.uri), "run_id": self.run_id}
        if self.uri.startswith(("http://", "https://")) and self.experiment_id is not None:
            base = redact_text(self.uri).rstrip("/")
            out["url"] = f"{base}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
        return out
