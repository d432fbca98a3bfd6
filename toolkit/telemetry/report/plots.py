"""PNG plots (matplotlib, Agg): step time per rank, GPU utilization and power heatmaps per
node, and the throughput timeline with checkpoint, preemption and restart events."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit.runmodel import RATE_FIELD
from toolkit.telemetry.read import RunData
from toolkit.telemetry.report import curves
from toolkit.telemetry.report.analysis import RankSeries, blocking_span
from toolkit.telemetry.report.figures import binned, figure
from toolkit.telemetry.schema import PREEMPTION, RESTART

if TYPE_CHECKING:
    from toolkit.telemetry.report.record import Report


def step_time_plot(
    series: dict[int, RankSeries], stragglers: set[int], t0: float, path: Path, max_points: int
) -> Path:
    from matplotlib.collections import LineCollection

    plt, (fig, ax) = figure(figsize=(11, 4.5))
    others = []
    for r, s in series.items():
        x, y = binned((s.columns["wall_time"] - t0) / 60.0, s.columns["step_time_s"], max_points)
        if r in stragglers:
            ax.plot(x, y, lw=1.2, label=f"rank {r} (straggler)", zorder=3)
        else:
            others.append(np.column_stack([x, y]))
    if others:  # one artist for all the ordinary ranks: fast to draw with 1000s of ranks
        ax.add_collection(LineCollection(others, linewidths=0.5, colors="0.6", alpha=0.6))
        ax.autoscale_view()
    ax.set_xlabel("minutes since start")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"Step time per rank ({len(series)} ranks; stragglers in colour)")
    ys = np.concatenate([s.columns["step_time_s"] for s in series.values()])
    if len(ys):
        ax.set_ylim(0, float(np.percentile(ys, 99.5)) * 1.3)
    if stragglers:
        ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def gpu_heatmap(run: RunData, t0: float, t1: float, path: Path, bins: int = 300) -> Path | None:
    rows, labels = [], []
    edges = np.linspace(t0, t1, bins + 1)
    for n in sorted(run.nodes, key=lambda n: (n.node, n.attempt)):
        for index, t in sorted(n.gpus.items()):
            if len(t) == 0 or "utilization_gpu_pct" not in t:
                continue
            idx = np.clip(np.searchsorted(edges, t["time"]) - 1, 0, bins - 1)
            count = np.bincount(idx, minlength=bins)
            util = np.bincount(idx, weights=np.nan_to_num(t["utilization_gpu_pct"]), minlength=bins)
            power = t.get("power_w")
            pw = (
                np.bincount(idx, weights=np.nan_to_num(power), minlength=bins)
                if power is not None
                else util * np.nan
            )
            with np.errstate(invalid="ignore", divide="ignore"):
                rows.append((util / count, pw / count))
            labels.append(f"{n.node}:{index}" + (f" a{n.attempt}" if n.attempt else ""))
    if not rows:
        return None
    key = {}
    for label, row in zip(labels, rows, strict=True):  # merge attempts of the same GPU
        base = label.split(" a")[0]
        if base in key:
            u, p = key[base]
            key[base] = (np.fmax(u, row[0]), np.fmax(p, row[1]))
        else:
            key[base] = row
    labels = list(key)
    util = np.stack([v[0] for v in key.values()])
    power = np.stack([v[1] for v in key.values()])
    height = max(3.0, 0.12 * len(labels) + 1.5)
    plt, (fig, axes) = figure(1, 2, figsize=(14, height), sharey=True)
    extent = (0, (t1 - t0) / 60.0, len(labels), 0)
    for ax, data, title, cmap, unit in (
        (axes[0], util, "GPU utilization", "viridis", "%"),
        (axes[1], power, "GPU power", "inferno", "W"),
    ):
        im = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, extent=extent)
        ax.set_title(title)
        ax.set_xlabel("minutes since start")
        fig.colorbar(im, ax=ax, label=unit)
    step = max(1, len(labels) // 40)
    axes[0].set_yticks(np.arange(len(labels))[::step] + 0.5)
    axes[0].set_yticklabels(labels[::step], fontsize=6)
    fig.subplots_adjust(left=0.09, right=0.99, bottom=0.08, top=0.93, wspace=0.08)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def throughput_plot(
    series: dict[int, RankSeries],
    events: list[dict[str, Any]],
    gaps: list,
    t0: float,
    path: Path,
    max_points: int,
    unit: str = "tokens",
) -> Path:
    plt, (fig, ax) = figure(figsize=(11, 4))
    if series:
        s = series[min(series)]
        for attempt in np.unique(s.attempt):
            sel = s.attempt == attempt
            t = s.columns["wall_time"][sel]
            y = s.columns[RATE_FIELD[unit] if RATE_FIELD[unit] in s.columns else "tokens_per_s"][
                sel
            ]
            # Break the line where steps stop (stall, gap) instead of drawing across.
            limit = max(5.0, 5 * float(np.median(np.diff(t)))) if len(t) > 1 else 5.0
            cuts = np.nonzero(np.diff(t) > limit)[0] + 1
            color = None
            for i, (ts, ys) in enumerate(zip(np.split(t, cuts), np.split(y, cuts), strict=True)):
                points = max(10, max_points * len(ts) // max(1, len(t)))
                bx, by = binned((ts - t0) / 60.0, ys, points)
                label = f"{unit}/s (attempt {attempt})" if i == 0 else None
                (line,) = ax.plot(bx, by, lw=0.8, label=label, color=color)
                color = line.get_color()
    seen = set()
    spans = {}  # the same checkpoint/preemption seen by every rank: draw it once
    for e in events:
        spans.setdefault((e["name"], round(e["start"]), round(e["end"])), e)
    for e in spans.values():
        x0, x1 = (e["start"] - t0) / 60.0, (e["end"] - t0) / 60.0
        stall = blocking_span(e)
        if stall is not None:
            x1 = (stall[1] - t0) / 60.0
            kind, color = "checkpoint stall", "tab:orange"
            ax.axvspan(
                x0, max(x1, x0 + 0.05), color=color, alpha=0.3, label=None if kind in seen else kind
            )
        elif e["name"] in (PREEMPTION, RESTART):
            kind, color = e["name"], "tab:red" if e["name"] == PREEMPTION else "tab:green"
            ax.axvline(x1, color=color, ls="--", lw=1.2, label=None if kind in seen else kind)
        else:
            continue
        seen.add(kind)
    for g in gaps:
        label = None if "idle gap" in seen else "idle gap"
        ax.axvspan(
            (g.start - t0) / 60.0,
            (g.end - t0) / 60.0,
            color="0.5",
            alpha=0.25,
            hatch="//",
            label=label,
        )
        seen.add("idle gap")
    ax.set_xlabel("minutes since start")
    ax.set_ylabel(f"{unit}/s (job)")
    ax.set_title("Throughput with checkpoints, preemptions, restarts and idle gaps")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(
    run: RunData, series: dict[int, RankSeries], report: Report, out: Path, max_points: int
) -> dict[str, Path]:
    times = [float(s.start.min()) for s in series.values()]
    ends = [float(s.columns["wall_time"].max()) for s in series.values()]
    for n in run.nodes:
        for t in n.gpus.values():
            if len(t):
                times.append(float(t["time"][0]))
                ends.append(float(t["time"][-1]))
    if not times:
        return {}
    t0, t1 = min(times), max(ends)
    stragglers = {int(s.who.split()[1]) for s in report.stragglers if s.kind == "rank"}
    out_paths = {}
    if series:
        out_paths["step_time_png"] = step_time_plot(
            series, stragglers, t0, out / "step_time.png", max_points
        )
        out_paths["throughput_png"] = throughput_plot(
            series,
            report.events,
            report.idle_gaps,
            t0,
            out / "throughput.png",
            max_points,
            report.unit,
        )
    heat = gpu_heatmap(run, t0, max(t1, t0 + 1), out / "gpu_heatmap.png")
    if heat is not None:
        out_paths["gpu_heatmap_png"] = heat
    for key, made in (
        (
            "training_png",
            curves.training_curves(series, report.events, out / "training.png", max_points),
        ),
        ("host_png", curves.host_curves(run, t0, out / "host.png", max_points)),
        ("gpu_curves_png", curves.gpu_curves(run, t0, out / "gpu_curves.png", max_points)),
    ):
        if made is not None:
            out_paths[key] = made
    return out_paths
