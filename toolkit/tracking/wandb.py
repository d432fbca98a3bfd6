"""Weights & Biases: offline by default, files under RUN_DIR/tracking/wandb (`wandb sync`
them later); online only with tracking.wandb_mode=online, the key from WANDB_API_KEY. The
run id is kept in RUN_DIR/tracking/wandb_run_id, so a resumed job continues the run."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import Any

from toolkit.config.tracking import TrackingConfig
from toolkit.events import Event, StepRecord
from toolkit.files import write_private
from toolkit.tracking.base import Params, event_scalars, scalars


class WandbTracker:
    name = "wandb"

    def __init__(self, cfg: TrackingConfig, run_dir: Path):
        self.cfg = cfg
        self.dir = run_dir / "tracking"
        self.id_file = run_dir / "tracking" / "wandb_run_id"
        self.run_id: str | None = None
        self._run: Any = None

    def open(self, params: Params) -> None:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.id_file.is_file():
            self.run_id = self.id_file.read_text().strip()
        else:
            self.run_id = secrets.token_hex(4)
            write_private(self.id_file, self.run_id)
        self._run = wandb.init(
            mode=self.cfg.wandb_mode,
            dir=str(self.dir),
            project=self.cfg.wandb_project or self.cfg.experiment,
            entity=self.cfg.wandb_entity,
            name=params.run_name,
            id=self.run_id,
            resume="allow",
            config={**params.config, "launch.overrides": " ".join(params.overrides)},
            # No console capture nor system sampling: the toolkit's telemetry does that.
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, items: list[StepRecord | Event]) -> None:
        # W&B steps only go forward: an eval at step N is logged with step N's records.
        for item in items:
            values = scalars(item) if isinstance(item, StepRecord) else event_scalars(item)
            self._run.log(values, step=item.step)

    def log_series(self, series: dict[str, list[tuple[float, float]]]) -> None:
        # Against their own axis (seconds since the first sample), not the training step.
        if not series:
            return
        self._run.define_metric("node/time_s")
        self._run.define_metric("node/*", step_metric="node/time_s")
        start = min(points[0][0] for points in series.values() if points)
        for name, points in series.items():
            for t, value in points:
                self._run.log({name: value, "node/time_s": t - start})

    def finish(self, artifacts: list[Path]) -> None:
        for path in artifacts:  # files in the run's files/ dir are synced with it
            shutil.copy2(path, Path(self._run.dir) / path.name)
        self._run.finish()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.cfg.wandb_mode, "run_id": self.run_id}
        if self._run is not None:
            out["dir"] = str(Path(self._run.dir).parent)
            if self.cfg.wandb_mode == "online":
                out["url"] = self._run.url
        return out
