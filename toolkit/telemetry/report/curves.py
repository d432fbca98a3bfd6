"""The curves people look at (matplotlib, Agg): loss (train and validation), grad norm and
learning rate against step; host CPU, memory, disk and network per node over time; and on
GPU nodes utilisation, memory, power and SM clock per node over time. Every line is
binned to at most max_points points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from toolkit.telemetry.read import RunData, Table
from toolkit.telemetry.report.analysis import RankSeries
from toolkit.telemetry.report.figures import binned, figure
from toolkit.telemetry.schema import EVAL


def training_curves(
    series: dict[int, RankSeries], events: list[dict[str, Any]], path: Path, max_points: int
) -> Path | None:
    """Loss, grad norm and learning rate per step (rank 0's record: they are global)."""
    if not series:
        return None
    s = series[min(series)]
    step = s.columns["step"].astype(float)
    plt, (fig, axes) = figure(1, 3, figsize=(14, 3.8))
    for ax, name, title in (
        (axes[0], "loss", "loss"),
        (axes[1], "grad_norm", "grad norm"),
        (axes[2], "lr", "learning rate"),
    ):
        if name in s.columns:
            x, y = binned(step, s.columns[name].astype(float), max_points)
            ax.plot(x, y, lw=0.9, label="train" if name == "loss" else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    val = sorted(
        {(e["step"], e["attrs"]["val_loss"]) for e in events if e["name"] == EVAL}
        if events
        else set()
    )
    val = [(a, b) for a, b in val if isinstance(b, (int, float))]
    if val:
        axes[0].plot(*zip(*val, strict=True), "o-", ms=3, lw=1, label="validation")
    axes[0].legend(fontsize=8)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.9, wspace=0.25)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _node_lines(
    tables: list[tuple[str, Table]], column: str, scale: float, t0: float, max_points: int
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    out = []
    for label, t in tables:
        if len(t) == 0 or column not in t:
            continue
        x, y = binned((t["time"] - t0) / 60.0, t[column].astype(float) * scale, max_points)
        out.append((label, x, y))
    return out


def _panel_grid(panels: list[tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]], path: Path):
    panels = [p for p in panels if p[1]]
    if not panels:
        return None
    cols = 2
    rows = (len(panels) + 1) // 2
    plt, (fig, axes) = figure(rows, cols, figsize=(14, 3.2 * rows), squeeze=False)
    for ax, (title, lines) in zip(axes.flat, panels, strict=False):
        for label, x, y in lines:
            ax.plot(x, y, lw=0.7, label=label)
        ax.set_title(title)
        ax.set_xlabel("minutes since start")
        ax.grid(alpha=0.3)
        if len(lines) <= 8:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def host_curves(run: RunData, t0: float, path: Path, max_points: int) -> Path | None:
    """CPU %, memory used, disk and network rates per node (attempts drawn as one node)."""
    hosts = [(n.node, n.host) for n in run.nodes if n.host is not None]
    net: list[tuple[str, Table]] = [
        (f"{n.node}:{name}", t) for n in run.nodes for name, t in n.net.items() if name != "lo"
    ]
    mb = 1e-6
    panels = [
        ("CPU (% of all cores)", _node_lines(hosts, "cpu_pct", 1.0, t0, max_points)),
        ("memory used (GiB)", _node_lines(hosts, "mem_used_bytes", 2**-30, t0, max_points)),
        ("disk read (MB/s)", _node_lines(hosts, "disk_read_bytes_per_s", mb, t0, max_points)),
        ("disk write (MB/s)", _node_lines(hosts, "disk_write_bytes_per_s", mb, t0, max_points)),
        ("network receive (MB/s)", _node_lines(net, "rx_bytes_per_s", mb, t0, max_points)),
        ("network transmit (MB/s)", _node_lines(net, "tx_bytes_per_s", mb, t0, max_points)),
    ]
    return _panel_grid(panels, path)


def _node_gpu_mean(run: RunData) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Per node (and attempt): the mean over its GPUs of each column, on the first GPU's
    sample times (the agent samples all GPUs of a node together)."""
    out = []
    for n in run.nodes:
        tables = [t for t in n.gpus.values() if len(t)]
        if not tables:
            continue
        length = min(len(t) for t in tables)
        cols: dict[str, np.ndarray] = {"time": tables[0]["time"][:length]}
        for name in ("utilization_gpu_pct", "memory_used_bytes", "power_w", "clock_sm_mhz"):
            have = [t[name][:length].astype(float) for t in tables if name in t]
            if have:
                with np.errstate(invalid="ignore"):
                    cols[name] = np.nanmean(np.stack(have), axis=0)
        out.append((n.node, cols))
    return out


def gpu_curves(run: RunData, t0: float, path: Path, max_points: int) -> Path | None:
    nodes = _node_gpu_mean(run)
    if not nodes:
        return None

    def lines(name: str, scale: float) -> list[tuple[str, np.ndarray, np.ndarray]]:
        out = []
        for node, cols in nodes:
            if name in cols:
                x, y = binned((cols["time"] - t0) / 60.0, cols[name] * scale, max_points)
                out.append((node, x, y))
        return out

    panels = [
        ("GPU utilisation (%, mean of the node's GPUs)", lines("utilization_gpu_pct", 1.0)),
        ("GPU memory used (GiB, mean per GPU)", lines("memory_used_bytes", 2**-30)),
        ("GPU power (W, mean per GPU)", lines("power_w", 1.0)),
        ("SM clock (MHz, mean per GPU)", lines("clock_sm_mhz", 1.0)),
    ]
    return _panel_grid(panels, path)
