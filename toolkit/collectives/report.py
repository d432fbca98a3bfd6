"""The benchmark's results: rows, the nccl-tests-style table, and the HDF5 file."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from toolkit.collectives.busbw import average

H5_NAME = "collectives.h5"
TABLE_NAME = "collectives.txt"


@dataclass
class Row:
    op: str
    size_bytes: int
    count: int
    dtype: str
    redop: str  # "none" for ops without reduction
    root: int  # -1 for ops without root
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int
    baseline_time_us: float = float("nan")
    baseline_busbw_gbps: float = float("nan")
    paired_ratio: float = float("nan")  # median over repeats of busbw / baseline busbw


def header(compare_baseline: bool) -> list[str]:
    extra_names = "   base time  base busbw   ratio" if compare_baseline else ""
    extra_units = "        (us)      (GB/s)        " if compare_baseline else ""
    return [
        f"#{'size':>12} {'count':>12} {'type':>9} {'redop':>6} {'root':>5} {'time':>10} "
        f"{'algbw':>8} {'busbw':>8} {'#wrong':>7}{extra_names}",
        f"#{'(B)':>12} {'(elements)':>12} {'':>9} {'':>6} {'':>5} {'(us)':>10} "
        f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7}{extra_units}",
    ]


def format_row(row: Row, compare_baseline: bool) -> str:
    line = (
        f" {row.size_bytes:>12} {row.count:>12} {row.dtype:>9} {row.redop:>6} {row.root:>5} "
        f"{row.time_us:>10.1f} {row.algbw_gbps:>8.3f} {row.busbw_gbps:>8.3f} {row.wrong:>7}"
    )
    if compare_baseline:
        line += (
            f" {row.baseline_time_us:>11.1f} {row.baseline_busbw_gbps:>11.3f}"
            f" {row.paired_ratio:>7.3f}"
        )
    return line


def op_header(op: str, compare_baseline: bool) -> list[str]:
    return ["#", f"# {op}", *header(compare_baseline)]


def op_footer(op: str, op_rows: list[Row]) -> list[str]:
    lines = [
        f"# {op}: out of bounds values : {sum(r.wrong for r in op_rows)} (wrong)",
        f"# {op}: Avg bus bandwidth    : {average([r.busbw_gbps for r in op_rows]):.4f} GB/s",
    ]
    ratios = [r.paired_ratio for r in op_rows if not math.isnan(r.paired_ratio)]
    if ratios:
        lines.append(
            f"# {op}: busbw / baseline busbw : median {statistics.median(ratios):.3f} "
            f"over {len(ratios)} sizes (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )
    return lines


def format_table(rows: list[Row], ops: list[str], compare_baseline: bool, title: str) -> str:
    lines = [f"# {title}"]
    for op in ops:
        op_rows = [r for r in rows if r.op == op]
        if not op_rows:
            continue
        lines += op_header(op, compare_baseline)
        lines += [format_row(r, compare_baseline) for r in op_rows]
        lines += op_footer(op, op_rows)
    lines.append(
        f"# Avg bus bandwidth (all ops) : {average([r.busbw_gbps for r in rows]):.4f} GB/s"
    )
    return "\n".join(lines)


def op_averages(rows: list[Row]) -> dict[str, float]:
    ops = list(dict.fromkeys(r.op for r in rows))
    return {op: average([r.busbw_gbps for r in rows if r.op == op]) for op in ops}


def write_h5(path: Path, rows: list[Row], attrs: dict[str, Any]) -> None:
    """One group per op, one dataset per column; run facts as root attributes."""
    import h5py
    import numpy as np

    with h5py.File(path, "w") as f:
        for key, value in attrs.items():
            if isinstance(value, dict | list):
                value = json.dumps(value)
            elif isinstance(value, str):
                value = str(value)  # plain str: h5py rejects subclasses such as TorchVersion
            f.attrs[key] = value
        averages = op_averages(rows)
        f.attrs["avg_busbw_gbps"] = average([r.busbw_gbps for r in rows])
        for op, avg in averages.items():
            group = f.create_group(op)
            group.attrs["avg_busbw_gbps"] = avg
            op_rows = [r for r in rows if r.op == op]
            for field in fields(Row):
                if field.name == "op":
                    continue
                values = [getattr(r, field.name) for r in op_rows]
                if field.type in ("str", str):
                    group.create_dataset(field.name, data=np.array(values, dtype="S"))
                else:
                    group.create_dataset(field.name, data=np.array(values))


def read_h5(path: Path) -> tuple[list[Row], dict[str, Any]]:
    """Rows and root attributes of a collectives.h5 (for comparisons across runs)."""
    import h5py

    rows: list[Row] = []
    with h5py.File(path, "r") as f:
        attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        for op in f:
            group = f[op]
            n = len(group["size_bytes"])
            for i in range(n):
                values: dict[str, Any] = {"op": op}
                for field in fields(Row):
                    if field.name == "op":
                        continue
                    v = group[field.name][i]
                    values[field.name] = v.decode() if isinstance(v, bytes) else v.item()
                rows.append(Row(**values))
    return rows, attrs
