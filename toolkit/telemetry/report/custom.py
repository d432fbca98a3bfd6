"""Your own series in the report: what a callback's `step_metrics` and `session.log`'s other
names recorded at each step (metrics/rank0.jsonl, the last attempt's record of each step),
and the eval metrics besides the loss (a callback's `eval_metrics`, val_ic): one plot each,
against the step. Files are named by their index (series_00.png, ...), never by a name read
from the run dir; at most MAX_SERIES of them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.events import STEP_FIELDS, last_attempt, read_records
from toolkit.telemetry.report.figures import binned, figure
from toolkit.telemetry.schema import EVAL

MAX_SERIES = 32
STANDARD_EVAL = ("val_loss",)  # drawn with the training loss already


def custom_series(run_dir: Path, events: list[dict[str, Any]]) -> dict[str, list[tuple]]:
    """name -> [(step, value)]: each numeric name of rank 0's step records that is no field
    of a StepRecord, then each eval metric as eval/<name>."""
    out: dict[str, list[tuple]] = {}
    for record in last_attempt(read_records(run_dir / "metrics" / "rank0.jsonl")):
        for name, value in record.items():
            if name not in STEP_FIELDS and _number(value):
                out.setdefault(name, []).append((record["step"], float(value)))
    evals = sorted(
        {
            (e["step"], k, v)
            for e in events
            if e["name"] == EVAL
            for k, v in e["attrs"].items()
            if k not in STANDARD_EVAL and _number(v)
        }  # fmt: skip
    )
    for step, name, value in evals:
        out.setdefault(f"eval/{name}", []).append((step, float(value)))
    return out


def custom_curves(
    run_dir: Path, events: list[dict[str, Any]], out: Path, max_points: int
) -> list[tuple[str, Path]]:
    """(name, png) for each series of `custom_series`, at most MAX_SERIES."""
    made = []
    for i, (name, points) in enumerate(sorted(custom_series(run_dir, events).items())):
        if i >= MAX_SERIES:
            break
        steps, values = (np.array(v, dtype=float) for v in zip(*points, strict=True))
        plt, (fig, ax) = figure(figsize=(7, 3))
        x, y = binned(steps, values, max_points)
        ax.plot(x, y, "o-" if len(x) < 30 else "-", ms=3, lw=0.9)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        fig.subplots_adjust(left=0.1, right=0.98, bottom=0.17, top=0.88)
        path = out / f"series_{i:02d}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append((name, path))
    return made


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )
