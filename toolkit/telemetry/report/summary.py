"""Per-node summaries, for reports of long multi-node runs.

One pass over a node file, one rank's (or one GPU's) columns at a time, never the whole
job, reduced to what the report needs: per-rank statistics and sums, per-chunk step means
(stragglers are found chunk by chunk), idle-gap candidates, per-GPU statistics and
downsampled series. The result is cached beside the node file as JSON (mode 0600, written
atomically), keyed on the file's size and mtime and on the report settings that change it,
so a second report reads 64 small files instead of 10 GB of HDF5. Arrays are stored as
base64 of their raw bytes inside the JSON (compact, and no pickle)."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.config.telemetry import STRAGGLER_METRICS, ReportConfig
from toolkit.telemetry.read import NodeData, Table, load_node
from toolkit.telemetry.report.gpustats import gpu_stats

log = logging.getLogger(__name__)

SUMMARY_VERSION = 1
MAX_CHUNKS = 1024  # per rank: steps are grouped into chunks of 2**k steps, at most this many
SERIES_POINTS = 1000  # time buckets per node series (GPU, host, network)
COMM_FIELDS = ("comm_all_gather_s", "comm_reduce_scatter_s", "comm_all_reduce_s", "comm_p2p_s")
SPLIT_SUMS = (
    "step_time_s",
    "data_wait_s",
    "comm_s",
    "compute_s",
    "comm_exposed_s",
    "optimizer_step_s",
    "checkpoint_stall_s",
)
TERM_FIELDS = ("compute_s", "comm_exposed_s", "optimizer_step_s", "data_wait_s", "step_time_s")
TERM_FIELDS += ("checkpoint_stall_s",)
# Chunk means kept per rank: what the stragglers, the verdict's wait and the plots read.
CHUNK_FIELDS = tuple(
    dict.fromkeys(
        ("wall_time", "step_time_s", "tokens_per_s", "compute_s", "comm_exposed_s")
        + STRAGGLER_METRICS
    )
)
CURVE_FIELDS = ("loss", "grad_norm", "lr")  # only for the node's first rank
GPU_SERIES = ("utilization_gpu_pct", "memory_used_bytes", "power_w", "clock_sm_mhz")
HOST_SERIES = ("cpu_pct", "mem_used_bytes", "disk_read_bytes_per_s", "disk_write_bytes_per_s")
NET_SERIES = ("rx_bytes_per_s", "tx_bytes_per_s")


def pack(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def unpack(d: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(d["dtype"])
    if dtype.kind not in "fiub":  # numbers only: nothing else is ever stored
        raise ValueError(f"summary array of dtype {dtype}")
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=dtype)


def cache_path(node_file: Path) -> Path:
    return node_file.with_name(node_file.stem + ".summary.json")


def cache_key(node_file: Path, cfg: ReportConfig) -> dict[str, Any]:
    st = node_file.stat()
    return {
        "version": SUMMARY_VERSION,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "skip_first_steps": cfg.skip_first_steps,
        "idle_gap_min_s": cfg.idle_gap_min_s,
        "idle_gap_factor": cfg.idle_gap_factor,
    }


def load_cached(node_file: Path, cfg: ReportConfig) -> dict[str, Any] | None:
    """The cached summary when it matches the file and settings, else None."""
    path = cache_path(node_file)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != cache_key(node_file, cfg):
        return None
    return data


def store(node_file: Path, summary: dict[str, Any]) -> None:
    """Write the summary beside the node file (0600, atomic); a read-only run directory
    only costs the next report a recomputation."""
    path = cache_path(node_file)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(summary, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError as exc:
        log.info("telemetry report: summary cache not written (%s): %s", path, exc)
        tmp.unlink(missing_ok=True)


def summarise(node_file: Path, cfg: ReportConfig, use_cache: bool = True) -> dict[str, Any]:
    """The node file's summary: from the cache when valid, else computed (and cached).
    The key is taken before reading, so a file that grows meanwhile is read again next time."""
    if use_cache:
        cached = load_cached(node_file, cfg)
        if cached is not None:
            cached["cached"] = True
            return cached
    key = cache_key(node_file, cfg)
    node = load_node(node_file)
    try:
        summary = compute(node, cfg)
    finally:
        node.close()
    summary["key"] = key
    if use_cache:
        store(node_file, summary)
    summary["cached"] = False
    return summary


def compute(node: NodeData, cfg: ReportConfig) -> dict[str, Any]:
    ranks = sorted(r for r, t in node.steps.items() if len(t))
    first = ranks[0] if ranks else None
    return {
        "path": str(node.path),
        "node": node.node,
        "attempt": node.attempt,
        "job_id": node.job_id,
        "ranks": node.ranks,
        "world_size": int(node.attrs.get("world_size", 0) or 0),
        "absent": node.absent(),
        "events": node.events,
        "steps": {str(r): rank_summary(node.steps[r], cfg, r == first) for r in ranks},
        "gpus": {
            str(g.index): dataclasses.asdict(g)
            | {"series": table_series(node.gpus[g.index], GPU_SERIES)}
            for g in gpu_stats(node)
        },
        "host_series": table_series(node.host, HOST_SERIES) if node.host is not None else None,
        "net_series": {
            k: table_series(t, NET_SERIES) for k, t in node.net.items() if k != "lo" and len(t)
        },
        "ib_xmit_bytes_per_s": [
            float(np.nanmean(t["xmit_bytes_per_s"]))
            for t in node.ib.values()
            if "xmit_bytes_per_s" in t and len(t)
        ],
    }


def chunk_size(max_step: int) -> int:
    size = 1
    while max_step // size + 1 > MAX_CHUNKS:
        size *= 2
    return size


def _median(a: np.ndarray) -> float:
    return float(np.median(a)) if len(a) else float("nan")


def rank_summary(t: Table, cfg: ReportConfig, curves: bool) -> dict[str, Any]:
    """One rank's steps in this file: statistics of the measured (post warm-up) steps, sums
    for the time attribution, chunk sums for stragglers and plots, idle-gap candidates."""
    n = len(t)
    cols = {name: t[name] for name in ("step", "wall_time", "step_time_s")}
    step = cols["step"].astype(np.int64)
    keep = np.arange(n) >= cfg.skip_first_steps
    if not keep.any():
        keep[:] = True
    rates = ("tokens_per_s", "samples_per_s", "mfu")
    measured = {name: t[name][keep] for name in TERM_FIELDS + rates if name in t}
    st = measured["step_time_s"]
    wait = measured.get("data_wait_s", np.zeros(len(st)))
    out: dict[str, Any] = {
        "n": n,
        "median_step_s": _median(st),
        "p99_step_s": float(np.percentile(st, 99)),
        "median_tokens_per_s": _median(measured.get("tokens_per_s", np.array([]))),
        "median_samples_per_s": _median(measured.get("samples_per_s", np.array([]))),
        "median_mfu": _median(measured.get("mfu", np.array([]))),
        "data_wait_share": float(wait.sum() / st.sum()) if st.sum() > 0 else 0.0,
        "medians": {name: _median(v) for name, v in measured.items()},
        "measured_wait_s": float(wait.sum()),
        "measured_step_s": float(st.sum()),
        "columns": list(t.names),
    }
    busy = [t[f][keep] for f in COMM_FIELDS if f in t]
    if busy:
        out["medians"]["comm_busy_s"] = _median(np.sum(busy, axis=0))
    # Sums over every row (the attribution counts warm-up steps too).
    out["sums"] = {name: float(t[name].sum()) for name in SPLIT_SUMS if name in t}
    out["split_finite"] = all(
        name in t and bool(np.isfinite(t[name]).all())
        for name in ("compute_s", "comm_exposed_s", "optimizer_step_s", "checkpoint_stall_s")
    )
    start = cols["wall_time"] - cols["step_time_s"]
    out["first_start"] = float(start.min())
    out["last_end"] = float(cols["wall_time"].max())
    threshold = max(cfg.idle_gap_min_s, cfg.idle_gap_factor * _median(cols["step_time_s"]))
    gap = start[1:] - cols["wall_time"][:-1]
    idx = np.nonzero(gap > threshold)[0]
    out["gaps"] = [[float(cols["wall_time"][i]), float(start[i + 1])] for i in idx]
    # Chunks of 2**k steps (k from this file's last step; the report regroups to the
    # coarsest size of all files): counts and sums of the measured steps.
    size = chunk_size(int(step.max()))
    index = step[keep] // size
    count = np.bincount(index)
    have = np.nonzero(count)[0]
    fields = CHUNK_FIELDS + (CURVE_FIELDS if curves else ()) + ("step",)
    sums = {
        name: pack(np.bincount(index, weights=t[name][keep].astype(np.float64))[have])
        for name in fields
        if name in t
    }
    out["chunks"] = {"size": size, "index": pack(have), "count": pack(count[have]), "sums": sums}
    return out


def bucket_means(
    times: np.ndarray, columns: dict[str, np.ndarray], points: int = SERIES_POINTS
) -> dict[str, Any]:
    """The mean of each column over `points` equal-time buckets of the table's own span
    (empty buckets dropped), and the mean time of each bucket: the plots draw at most
    max_plot_points points a line, so nothing they show is lost."""
    if len(times) == 0:
        return {}
    lo, hi = float(times[0]), float(times[-1])
    edges = np.linspace(lo, max(hi, lo + 1e-9), points + 1)
    idx = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, points - 1)
    count = np.bincount(idx, minlength=points)
    have = count > 0
    out = {"time": pack(np.bincount(idx, weights=times, minlength=points)[have] / count[have])}
    for name, values in columns.items():
        v = values.astype(np.float64)
        ok = np.isfinite(v)
        n = np.bincount(idx[ok], minlength=points)[have]
        total = np.bincount(idx[ok], weights=v[ok], minlength=points)[have]
        with np.errstate(invalid="ignore", divide="ignore"):
            out[name] = pack(np.where(n > 0, total / np.maximum(n, 1), np.nan))
    return out


def table_series(t: Table | None, names: tuple[str, ...]) -> dict[str, Any]:
    if t is None or len(t) == 0 or "time" not in t:
        return {}
    return bucket_means(t["time"], {n: t[n] for n in names if n in t})
