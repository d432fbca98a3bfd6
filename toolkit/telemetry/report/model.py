"""The performance model's prediction for a run's configuration: the one place the report
calls toolkit.perfmodel (its entry point may change; adapt it here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.perfmodel.split import MEASURED_FIELD, predicted_split

# Measured StepRecord field (median per step) compared with each predicted term: the
# model's split (toolkit.perfmodel.split) plus all communication, busy or hidden.
MEASURED_OF_TERM = {**MEASURED_FIELD, "communication": "comm_busy_s"}


def load_config(run_dir: Path) -> Any:
    """The run's JobConfig from RUN_DIR/config.yaml, or None when absent or unreadable."""
    from toolkit.config.compose import load_job

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    try:
        return load_job(path)
    except Exception:  # noqa: BLE001 - an old or edited config: no model comparison
        return None


def predicted_terms(job: Any, world_size: int) -> tuple[dict[str, float], str]:
    """Seconds per step per term as the model predicts them for this job and world size,
    and a note ('' when it worked)."""
    if job is None:
        return {}, "no readable RUN_DIR/config.yaml: no model prediction"
    try:
        from toolkit.perfmodel import predict_job
        from toolkit.perfmodel.count_job import counted_shape_or_none

        time = predict_job(job, world_size, counted_shape_or_none(job)).time
        split = predicted_split(time)  # compute, exposed communication, optimizer, ...
        split["communication"] = float(time["communication_total_s"])
        return split, ""
    except Exception as exc:  # noqa: BLE001 - the model must never break the report
        return {}, f"performance model unavailable: {type(exc).__name__}: {exc}"
