"""The performance model's prediction for a run's configuration: the one place the report
calls toolkit.perfmodel (its entry point may change; adapt it here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Measured StepRecord field (median per step) compared with each predicted term.
MEASURED_OF_TERM = {
    "compute": "compute_s",
    "communication": "comm_busy_s",
    "exposed_communication": "comm_exposed_s",
    "optimizer": "optimizer_step_s",
    "data_wait": "data_wait_s",
    "step": "step_time_s",
}


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

        time = predict_job(job, world_size).time
        return {
            "compute": float(time["compute_s"]),  # GEMMs, attention, elementwise, op overhead
            "communication": float(time["communication_total_s"]),
            "exposed_communication": float(time["communication_s"]),
            "optimizer": float(time["optimizer_s"]),
            "data_wait": float(time["data_wait_s"]),
            "step": float(time["step_s"]),
        }, ""
    except Exception as exc:  # noqa: BLE001 - the model must never break the report
        return {}, f"performance model unavailable: {type(exc).__name__}: {exc}"
