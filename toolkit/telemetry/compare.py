"""`python -m toolkit.telemetry compare RUN_A RUN_B`: two runs side by side, per term of the
step, throughput, MFU, memory and the configuration keys that differ, with which
differences are beyond run-to-run noise.

Noise comes from the runs themselves: every step repeats the same work, so the spread of
a metric over a run's steps gives the standard error of its median (1.253 x 1.4826 x MAD
/ sqrt(steps)). A difference is marked beyond noise when it exceeds `NOISE_SIGMAS` times
the combined standard error of both medians.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.runmodel import RATE_FIELD, run_unit
from toolkit.telemetry.read import load_run
from toolkit.telemetry.report.analysis import collect_steps
from toolkit.tracking.build import flatten, tracker_links

NOISE_SIGMAS = 3.0
METRICS = (
    "step_time_s",
    "data_wait_s",
    "compute_s",
    "comm_exposed_s",
    "optimizer_step_s",
    "checkpoint_stall_s",
    "other_s",
    "comm_all_gather_s",
    "comm_reduce_scatter_s",
    "comm_all_reduce_s",
    "tokens_per_s",
    "samples_per_s",
    "mfu",
    "mem_peak_bytes",
)
IGNORED_CONFIG_PREFIXES = ("hydra", "run_dir")


@dataclass
class Row:
    metric: str
    a: float
    b: float
    ratio: float  # b / a
    noise: float  # combined standard error of the two medians
    beyond_noise: bool


def step_values(run_dir: Path, skip_first_steps: int = 1) -> dict[str, np.ndarray]:
    """Per metric, one value per step: the mean over ranks (memory: the max)."""
    run = load_run(Path(run_dir))
    try:
        series = collect_steps(run, skip_first_steps)
    finally:
        run.close()
    out: dict[str, np.ndarray] = {}
    for metric in METRICS:
        per_rank = [s.columns[metric][~s.warmup] for s in series.values() if metric in s.columns]
        per_rank = [v for v in per_rank if len(v)]
        if not per_rank:
            continue
        n = min(len(v) for v in per_rank)
        stacked = np.stack([v[:n].astype(float) for v in per_rank])
        out[metric] = stacked.max(axis=0) if metric == "mem_peak_bytes" else stacked.mean(axis=0)
    return out


def median_error(values: np.ndarray) -> float:
    if len(values) < 2:
        return math.inf
    mad = float(np.median(np.abs(values - np.median(values))))
    return 1.253 * 1.4826 * mad / math.sqrt(len(values))


def compare_metrics(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[Row]:
    rows = []
    for metric in METRICS:
        if metric not in a or metric not in b:
            continue
        ma, mb = float(np.median(a[metric])), float(np.median(b[metric]))
        noise = math.hypot(median_error(a[metric]), median_error(b[metric]))
        ratio = mb / ma if ma else math.nan
        rows.append(Row(metric, ma, mb, ratio, noise, abs(mb - ma) > NOISE_SIGMAS * noise))
    return rows


def config_differences(run_a: Path, run_b: Path) -> list[tuple[str, Any, Any]]:
    from omegaconf import OmegaConf

    def load(run: Path) -> dict[str, Any]:
        path = Path(run) / "config.yaml"
        if not path.is_file():
            return {}
        return flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=False))

    a, b = load(run_a), load(run_b)
    keys = sorted(set(a) | set(b))
    return [
        (k, a.get(k), b.get(k))
        for k in keys
        if a.get(k) != b.get(k) and not k.startswith(IGNORED_CONFIG_PREFIXES)
    ]


def compare(run_a: Path, run_b: Path) -> dict[str, Any]:
    # The rate in the models' unit: tokens/s when both are token models, else samples/s
    # (every model has samples; a samples model's tokens/s means nothing).
    units = {run_unit(Path(run_a)), run_unit(Path(run_b))}
    unit = "tokens" if units == {"tokens"} else "samples"
    other = RATE_FIELD["samples" if unit == "tokens" else "tokens"]
    rows = compare_metrics(step_values(run_a), step_values(run_b))
    return {
        "run_a": str(run_a),
        "run_b": str(run_b),
        "unit": unit,
        "metrics": [asdict(r) for r in rows if r.metric != other],
        "config_differences": [
            {"key": k, "a": va, "b": vb} for k, va, vb in config_differences(run_a, run_b)
        ],
        # Each run's experiment trackers: the MLflow/W&B run or the TensorBoard log dir.
        "trackers": {"a": tracker_links(Path(run_a)), "b": tracker_links(Path(run_b))},
    }


def print_comparison(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(title=f"A: {result['run_a']}\nB: {result['run_b']}", title_justify="left")
    for h in ("metric", "A", "B", "B/A", "noise (1 se)", "beyond noise"):
        table.add_column(h, justify="left" if h == "metric" else "right")
    for r in result["metrics"]:
        seconds = r["metric"].endswith("_s") and not r["metric"].endswith("per_s")
        scale = 1000.0 if seconds else 1.0
        unit = " ms" if scale == 1000.0 else ""
        fmt = ",.4g"
        table.add_row(
            r["metric"],
            f"{scale * r['a']:{fmt}}{unit}",
            f"{scale * r['b']:{fmt}}{unit}",
            f"{r['ratio']:.3f}",
            f"{scale * r['noise']:{fmt}}{unit}",
            "yes" if r["beyond_noise"] else "no",
        )
    console.print(table)
    diffs = Table(title="Configuration differences", title_justify="left")
    for h in ("key", "A", "B"):
        diffs.add_column(h, justify="left")
    for d in result["config_differences"]:
        diffs.add_row(d["key"], str(d["a"]), str(d["b"]))
    console.print(diffs if result["config_differences"] else "Configuration: no differences")
    for side in ("a", "b"):
        for name, link in result["trackers"][side].items():
            console.print(f"{side.upper()} in {name}: {link}", soft_wrap=True)
