"""Exports: CSV of steps and events, and a Chrome-trace / Perfetto JSON (load it in
ui.perfetto.dev or chrome://tracing): one process per node, one thread per rank, a slice
per step and per event, counters for each node's mean GPU utilization and total power."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.telemetry.read import RunData
from toolkit.telemetry.report.analysis import RankSeries

STEP_FIELDS = (
    "step",
    "wall_time",
    "step_time_s",
    "data_wait_s",
    "forward_backward_s",
    "optimizer_s",
    "tokens_per_s",
    "mfu",
    "loss",
    "grad_norm",
    "lr",
    "mem_peak_bytes",
)


def _format(name: str, values: np.ndarray) -> str:
    """printf format of a column: ints as ints, wall times to the microsecond, the rest to
    7 significant digits (printf-style is several times faster than csv's float repr)."""
    if values.dtype.kind in "iu":
        return "%d"
    if name == "wall_time":
        return "%.6f"
    return "%.7g"


def write_csv(
    series: dict[int, RankSeries], events: list[dict[str, Any]], out: Path, steps: str = "steps"
) -> dict[str, str]:
    """steps.csv (or step_chunks.csv: a long run's chunk means) and events.csv."""
    steps_path = out / f"{steps}.csv"
    common = set.intersection(*(set(s.columns) for s in series.values())) if series else set()
    fields = [n for n in STEP_FIELDS if n in common] + sorted(common - set(STEP_FIELDS))
    with open(steps_path, "w", newline="") as f:
        f.write(",".join(["node", "attempt", "rank", *fields]) + "\n")
        for r, s in series.items():
            if not len(s):
                continue
            fmt = ",".join(["%s", "%d", "%d"] + [_format(n, s.columns[n]) for n in fields])
            columns = [s.node_of_row.tolist(), s.attempt.tolist(), [r] * len(s)]
            columns += [s.columns[n].tolist() for n in fields]
            f.write("\n".join([fmt % row for row in zip(*columns, strict=True)]) + "\n")
    events_path = out / "events.csv"
    with open(events_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["node", "attempt", "rank", "name", "start", "end", "duration_s", "step", "attrs"]
        )
        for e in events:
            w.writerow(
                [
                    e["node"],
                    e["attempt"],
                    e["rank"],
                    e["name"],
                    repr(e["start"]),
                    repr(e["end"]),
                    e["end"] - e["start"],
                    e["step"],
                    json.dumps(e["attrs"]),
                ]
            )
    return {f"{steps}_csv": str(steps_path), "events_csv": str(events_path)}


def write_trace(
    run: RunData, series: dict[int, RankSeries], events: list[dict[str, Any]], path: Path
) -> Path:
    """Chrome trace JSON, written as text line by line (fast for 10^5-10^6 slices)."""
    starts = [float(s.start.min()) for s in series.values() if len(s)]
    starts += [e["start"] for e in events]
    starts += [float(t["time"][0]) for n in run.nodes for t in n.gpus.values() if len(t)]
    t0 = min(starts) if starts else 0.0
    nodes = sorted({n.node for n in run.nodes} | {s.node for s in series.values()})
    pid = {name: i + 1 for i, name in enumerate(nodes)}
    lines: list[str] = []
    for name, p in pid.items():
        lines.append(
            json.dumps(
                {"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": name}}
            )
        )
    for r, s in series.items():
        p = pid[s.node]
        lines.append(
            json.dumps(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": p,
                    "tid": r,
                    "args": {"name": f"rank {r}"},
                }
            )
        )
        ts = (s.start - t0) * 1e6
        dur = s.columns["step_time_s"] * 1e6
        wait = np.nan_to_num(s.columns["data_wait_s"], nan=0.0)
        node_pids = [pid[n] for n in s.node_of_row.tolist()]
        step_line = (
            '{"ph":"X","name":"step","cat":"step","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,'
            '"args":{"step":%d,"data_wait_s":%.6f}}'
        )
        lines.extend(
            step_line % row
            for row in zip(
                node_pids,
                [r] * len(s),
                ts.tolist(),
                dur.tolist(),
                s.columns["step"].tolist(),
                wait.tolist(),
                strict=True,
            )
        )
    for e in events:
        p = pid.get(e["node"], 0)
        tid = e["rank"] if e["rank"] >= 0 else -1
        dur = max(0.0, e["end"] - e["start"]) * 1e6
        lines.append(
            json.dumps(
                {
                    "ph": "X" if dur > 0 else "i",
                    "name": e["name"],
                    "cat": "event",
                    "pid": p,
                    "tid": tid,
                    "ts": (e["start"] - t0) * 1e6,
                    "dur": dur,
                    "s": "p",
                    "args": e["attrs"],
                },
                default=str,
            )
        )
    for n in run.nodes:
        if not n.gpus:
            continue
        tables = [t for t in n.gpus.values() if len(t) and "utilization_gpu_pct" in t]
        if not tables:
            continue
        length = min(len(t) for t in tables)
        times = tables[0]["time"][:length]
        util = np.nanmean([t["utilization_gpu_pct"][:length] for t in tables], axis=0)
        power = np.nansum([t["power_w"][:length] for t in tables if "power_w" in t], axis=0)
        p = pid[n.node]
        keep = np.isfinite(util) & np.isfinite(power)
        counter_line = (
            '{"ph":"C","name":"gpu","pid":%d,"ts":%.3f,"args":{"util_pct":%.1f,"power_w":%.0f}}'
        )
        lines.extend(
            counter_line % (p, (t - t0) * 1e6, u, w)
            for t, u, w in zip(
                times[keep].tolist(), util[keep].tolist(), power[keep].tolist(), strict=True
            )
        )
    lines += host_counters(run, pid, t0)
    lines += profile_windows(run.run_dir, t0, first_pid=len(pid) + 1)
    with open(path, "w") as f:
        f.write(
            '{"displayTimeUnit":"ms","otherData":{"t0_unix_s":' + repr(t0) + '},"traceEvents":[\n'
        )
        f.write(",\n".join(lines))
        f.write("\n]}\n")
    return path


def host_counters(run: RunData, pid: dict[str, int], t0: float) -> list[str]:
    """Counter tracks per node: CPU % and memory used (GiB)."""
    line = '{"ph":"C","name":"host","pid":%d,"ts":%.3f,"args":{"cpu_pct":%.1f,"mem_used_gib":%.2f}}'
    out: list[str] = []
    for n in run.nodes:
        t = n.host
        if t is None or not len(t) or "cpu_pct" not in t or "mem_used_bytes" not in t:
            continue
        times, cpu, mem = t["time"], t["cpu_pct"], t["mem_used_bytes"] / 2**30
        keep = np.isfinite(cpu) & np.isfinite(mem)
        out.extend(
            line % (pid[n.node], (a - t0) * 1e6, b, c)
            for a, b, c in zip(
                times[keep].tolist(), cpu[keep].tolist(), mem[keep].tolist(), strict=True
            )
        )
    return out


def profile_files(run_dir: Path) -> list[Path]:
    """The run's profiler traces: RUN_DIR/profiles/step<N>/rank<k>.json.gz."""
    return sorted(Path(run_dir).glob("profiles/step*/rank*.json.gz"))


def profile_windows(run_dir: Path, t0: float, first_pid: int) -> list[str]:
    """Every profiler trace of the run on the telemetry timeline: one process per window
    and rank, timestamps moved from the trace's base time to the report's t0."""
    import gzip

    out: list[str] = []
    for i, path in enumerate(profile_files(run_dir)):
        try:
            with gzip.open(path, "rt") as f:
                trace = json.load(f)
        except (OSError, ValueError) as exc:
            out.append(
                json.dumps({"ph": "i", "name": f"unreadable {path.name}: {exc}", "pid": 0, "ts": 0})
            )
            continue
        shift_us = (trace.get("baseTimeNanoseconds", 0) / 1e9 - t0) * 1e6
        p = first_pid + i
        name = f"profile {path.parent.name} {path.name.split('.')[0]}"
        out.append(
            json.dumps({"ph": "M", "name": "process_name", "pid": p, "args": {"name": name}})
        )
        threads: dict[tuple[Any, Any], int] = {}  # the trace's (pid, tid) -> a tid here
        for e in trace.get("traceEvents", []):
            if e.get("ph") == "M" or "ts" not in e:
                continue
            tid = threads.setdefault((e.get("pid"), e.get("tid")), len(threads))
            e = dict(e, pid=p, tid=tid, ts=float(e["ts"]) + shift_us)
            out.append(json.dumps(e, default=str))
    return out
