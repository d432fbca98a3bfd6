"""A few node telemetry series for the experiment trackers: host CPU and memory, and per
GPU its utilisation, memory and power, from the run's node files (every node, the
attempts that started at or after `since`)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from toolkit.telemetry.read import load_node, node_files

log = logging.getLogger(__name__)

HOST_COLUMNS = ("cpu_pct", "mem_used_bytes")
GPU_COLUMNS = ("utilization_gpu_pct", "memory_used_bytes", "power_w")

# name -> [(time.time(), value), ...]
Series = dict[str, list[tuple[float, float]]]


def node_series(run_dir: Path, since: float) -> Series:
    """node/<host>/<column> and node/<host>/gpu<i>/<column>, samples at or after `since`."""
    out: Series = {}
    for path in node_files(run_dir):
        try:
            node = load_node(path, events=False)
        except Exception as exc:  # noqa: BLE001 - a file being written: skip it
            log.warning("tracking: node series: %s: %s", path.name, exc)
            continue
        try:
            tables = [(f"node/{node.node}", node.host, HOST_COLUMNS)]
            tables += [(f"node/{node.node}/gpu{i}", t, GPU_COLUMNS) for i, t in node.gpus.items()]
            for prefix, table, columns in tables:
                if table is None or len(table) == 0:
                    continue
                times = table["time"]
                keep = times >= since
                for column in columns:
                    if column in table:
                        values = table[column][keep].astype(float)
                        points = zip(times[keep].tolist(), values.tolist(), strict=True)
                        out[f"{prefix}/{column}"] = [(t, v) for t, v in points if np.isfinite(v)]
        finally:
            node.close()
    return out
