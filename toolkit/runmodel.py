"""RUN/model.json: what the readers of a run directory need of its model, as plain data.

A run records it itself (rank 0, once it has counted its model on its first micro-batch:
toolkit.perfmodel.count_job.record_run_model). Every command that reads a run directory
(report, status, runs, watch, compare, perfmodel/plan --run) takes the model's FLOPs per
sample, parameters, shapes and throughput unit from here, and never builds, imports or
instantiates anything the run directory names: a run directory is data, not code.

This module reads and writes JSON only (no torch, no config): a contract at the bottom.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.files import write_private

MODEL_FILE = "model.json"
UNITS = ("tokens", "samples")
NO_MODEL_JSON = "no model prediction (run recorded no model.json)"


@dataclass(frozen=True)
class RunModel:
    """A run's model as its readers need it (per sample: one sequence or one window)."""

    name: str
    unit: str  # the throughput unit: "tokens" (a token model) or "samples"
    flops_per_sample: float  # forward + backward model FLOPs (analytic, or counted)
    forward_flops_per_sample: float
    num_params: int  # parameters of one model (one member of an ensemble)
    param_bytes: int  # the parameters as stored (fp32): num_params * 4, times the ensemble
    tokens_per_sample: int  # 0: a sample is not a sequence of tokens
    saved_bytes_per_sample: float  # activations saved for backward (0: not counted)
    units: int  # FSDP2 units (the spec's), besides the root
    input_shape: list[int] = field(default_factory=list)  # one sample's input, no batch dim
    ensemble: int = 1  # K members trained in one step (trainer.ensemble)
    # Optional (absent in older files: 0, not counted): the aten ops of one forward +
    # backward, and the parameter tensors; the performance model's per-op floor.
    ops_per_micro_step: int = 0
    param_tensors: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class RunModelUnreadable(ValueError):
    """RUN/model.json exists but is not a model record; the message names the file."""


_NUMBERS = (
    "flops_per_sample",
    "forward_flops_per_sample",
    "saved_bytes_per_sample",
)
_COUNTS = ("num_params", "param_bytes", "tokens_per_sample", "units", "ensemble")
_OPTIONAL_COUNTS = ("ops_per_micro_step", "param_tensors")  # 0 where absent


def from_dict(value: Any, where: str = MODEL_FILE) -> RunModel:
    """A RunModel from parsed JSON, every field checked for its type (a wrong one raises
    RunModelUnreadable naming the field: the file is data someone else may have written)."""
    if not isinstance(value, dict):
        raise RunModelUnreadable(f"{where}: not a JSON object but a {type(value).__name__}")

    def bad(name: str, what: str) -> RunModelUnreadable:
        return RunModelUnreadable(f"{where}: {name}={value.get(name)!r}: {what}")

    if not isinstance(value.get("name"), str):
        raise bad("name", "not a string")
    if value.get("unit") not in UNITS:
        raise bad("unit", f"not one of {', '.join(UNITS)}")
    for name in _NUMBERS:
        v = value.get(name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise bad(name, "not a finite number >= 0")
    for name in _COUNTS:
        v = value.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(name, "not a whole number >= 0")
    for name in _OPTIONAL_COUNTS:
        v = value.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(name, "not a whole number >= 0")
    shape = value.get("input_shape", [])
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise bad("input_shape", "not a list of whole numbers")
    return RunModel(
        name=value["name"],
        unit=value["unit"],
        flops_per_sample=float(value["flops_per_sample"]),
        forward_flops_per_sample=float(value["forward_flops_per_sample"]),
        num_params=value["num_params"],
        param_bytes=value["param_bytes"],
        tokens_per_sample=value["tokens_per_sample"],
        saved_bytes_per_sample=float(value["saved_bytes_per_sample"]),
        units=value["units"],
        input_shape=list(shape),
        ensemble=max(1, value["ensemble"]),
        ops_per_micro_step=value.get("ops_per_micro_step", 0),
        param_tensors=value.get("param_tensors", 0),
    )


def read_run_model(run_dir: Path) -> RunModel | None:
    """RUN/model.json, or None when the run recorded none (an older run, a script).
    Raises RunModelUnreadable naming the file when it is damaged."""
    path = Path(run_dir) / MODEL_FILE
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError) as exc:
        raise RunModelUnreadable(f"{path}: unreadable ({exc})") from None
    return from_dict(value, str(path))


def run_model_or_note(run_dir: Path) -> tuple[RunModel | None, str]:
    """(the run's model, '') or (None, one line saying why there is none)."""
    try:
        model = read_run_model(run_dir)
    except RunModelUnreadable as exc:
        return None, f"no model prediction ({exc})"
    return (model, "") if model is not None else (None, NO_MODEL_JSON)


def write_run_model(run_dir: Path, model: RunModel) -> Path:
    """Write RUN/model.json (0600, atomically)."""
    path = Path(run_dir) / MODEL_FILE
    write_private(path, json.dumps(model.as_dict(), indent=2))
    return path


# The StepRecord field (and report column) of each unit's rate.
RATE_FIELD = {"tokens": "tokens_per_s", "samples": "samples_per_s"}


def run_unit(run_dir: Path) -> str:
    """The run's throughput unit for its readers: RUN/model.json's, else summary.json's
    `throughput_unit`, else tokens (an older run of a token model). Never raises: a damaged
    file counts as absent here (status names it)."""
    try:
        model = read_run_model(run_dir)
    except RunModelUnreadable:
        model = None
    if model is not None:
        return model.unit
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return "tokens"
    unit = summary.get("throughput_unit") if isinstance(summary, dict) else None
    return unit if unit in UNITS else "tokens"
