"""The performance model's prediction for a run's configuration: the one place the report
calls toolkit.perfmodel (its entry point may change; adapt it here).

A run directory is data, not code: the report reads config.yaml as plain values (the layout,
the hardware, a built-in transformer's shape) and the model's counted costs from the
RUN/model.json the run recorded (toolkit.runmodel). Nothing the run directory names is
imported, built or instantiated; a run without model.json gets no prediction for a model
that is not a built-in transformer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.perfmodel.split import MEASURED_FIELD, predicted_split
from toolkit.runmodel import NO_MODEL_JSON, RunModel, run_model_or_note

# Measured StepRecord field (median per step) compared with each predicted term: the
# model's split (toolkit.perfmodel.split) plus all communication, busy or hidden.
MEASURED_OF_TERM = {**MEASURED_FIELD, "communication": "comm_busy_s"}


def load_config(run_dir: Path) -> Any:
    """The run's JobConfig from RUN_DIR/config.yaml (plain values: no `_target_` it names is
    imported), or None when absent or unreadable."""
    from toolkit.config.compose import load_job

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    try:
        return load_job(path)
    except Exception:  # noqa: BLE001 - an old or edited config: no model comparison
        return None


def load_model(run_dir: Path) -> tuple[RunModel | None, str]:
    """The run's recorded model (RUN/model.json), or None and one line saying why not."""
    return run_model_or_note(Path(run_dir))


ARITHMETIC_TERMS = ("gemm", "attention", "elementwise")


def predicted_terms(
    job: Any, world_size: int, recorded: RunModel | None = None, no_model: str = ""
) -> tuple[dict[str, float], str]:
    """Seconds per step per term as the model predicts them for this job and world size,
    and a note ('' when it worked). A built-in transformer is predicted from its shape in
    config.yaml; any other model from `recorded` (its RUN/model.json), never by building
    it: without one, the note is `no_model` (why there is none)."""
    if job is None:
        return {}, "no readable RUN_DIR/config.yaml: no model prediction"
    try:
        from toolkit.config.model import TransformerConfig
        from toolkit.perfmodel import predict_job
        from toolkit.perfmodel.count_job import shape_of_run_model

        script = getattr(job, "script", None)
        if script is not None and script.enabled and recorded is None:
            # Your own script: config.yaml's model is the default one, which it never ran.
            from toolkit.redact import redact_text

            line = redact_text(script.command_line())
            return {}, f"a script run ({line}): no model prediction (it recorded no model.json)"
        if isinstance(job.model, TransformerConfig) and not (script and script.enabled):
            counted = None  # the analytic terms: arithmetic over config.yaml's numbers
        elif recorded is not None:
            counted = shape_of_run_model(recorded)
        else:
            return {}, no_model or NO_MODEL_JSON
        time = predict_job(job, world_size, counted).time
        split = predicted_split(time)  # compute, exposed communication, optimizer, ...
        split["communication"] = float(time["communication_total_s"])
        # The model's own arithmetic per step (no per-op floor): verdict's too-small check.
        split["arithmetic"] = sum(float(time[f"{t}_s"]) for t in ARITHMETIC_TERMS)
        return split, ""
    except Exception as exc:  # noqa: BLE001 - the model must never break the report
        return {}, f"performance model unavailable: {type(exc).__name__}: {exc}"
