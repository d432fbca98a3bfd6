"""TensorBoard: torch's SummaryWriter, event files under RUN_DIR/tracking/tensorboard (a
resumed run adds a file to the same directory, which TensorBoard reads as one run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit.events import Event, StepRecord
from toolkit.tracking.base import Params, event_scalars, scalars


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self._writer: Any = None

    def open(self, params: Params) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))
        text = "\n".join(f"    {k}: {v}" for k, v in sorted(params.config.items()))
        self._writer.add_text("config", text)
        self._writer.add_text("overrides", "    " + (" ".join(params.overrides) or "(none)"))

    def log(self, items: list[StepRecord | Event]) -> None:
        for item in items:
            if isinstance(item, StepRecord):
                values = scalars(item)
            else:
                values = event_scalars(item)
                if item.name != "eval":
                    self._writer.add_text(
                        f"event/{item.name}", json.dumps(item.attrs, default=str), item.step
                    )
            for tag, value in values.items():
                self._writer.add_scalar(tag, value, item.step, walltime=_walltime(item))
        self._writer.flush()

    def log_series(self, series: dict[str, list[tuple[float, float]]]) -> None:
        for tag, points in series.items():  # step: seconds since the series' first sample
            for t, value in points:
                self._writer.add_scalar(tag, value, int(t - points[0][0]), walltime=t)

    def finish(self, artifacts: list[Path]) -> None:
        for path in artifacts:
            if path.suffix == ".json":
                self._writer.add_text(f"artifact/{path.name}", "    " + path.read_text())
        self._writer.close()

    def describe(self) -> dict[str, Any]:
        return {"logdir": str(self.log_dir)}


def _walltime(item: StepRecord | Event) -> float:
    return item.wall_time if isinstance(item, StepRecord) else item.end
