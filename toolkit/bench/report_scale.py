"""The report at scale (`python -m toolkit.bench.profiling scale`): a synthetic run of N
nodes x G GPUs x H hours at 1 s sampling written by the real writer, then the report's
wall time, CPU seconds and peak RSS, first run (no cached summaries) and cached run, one
`watch --once`, and the live view's refresh. A benchmark, not a test: it prints what it
measured (baseline before summaries: BASELINE).

Peak RSS is read with getrusage in a wrapper process around each command: the command's
own process (self) and the largest of the processes it started (children: the summary
workers); self + 2 x children bounds the peak of the report and its two workers together."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Measured: 6.4 MB per node-hour for 8 GPUs, 4 IB ports, 0.5 s steps, gzip 4 (8x8x1 h: 51 MB).
BYTES_PER_GPU_HOUR = 0.8e6
BASELINE = {  # issue 19's closing note, before summaries (2026-12-01, load 5-12)
    "8x8x1h": {"report_s": 18.4, "peak_rss_mib": 715},
    "8x8x4h": {"report_s": 52.7, "peak_rss_mib": 2150},
}

WRAPPER = """
import json, resource, runpy, sys
sys.argv = ["toolkit.telemetry", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("toolkit.telemetry", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
rss = {"self_kib": me.ru_maxrss, "children_kib": kids.ru_maxrss, "cpu_s": cpu}
print("RSS " + json.dumps(rss), file=sys.stderr)
sys.exit(code)
"""


def measure(args: list[str]) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")},
    )
    wall = time.perf_counter() - t0
    rss = {"self_kib": 0, "children_kib": 0, "cpu_s": 0.0}
    for line in done.stderr.splitlines():
        if line.startswith("RSS "):
            rss = json.loads(line[4:])
    peak = (rss["self_kib"] + 2 * rss["children_kib"]) / 1024  # two summary workers at most
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(rss["cpu_s"], 1),  # user + system, the command and its workers
        "rc": done.returncode,
        "self_peak_rss_mib": round(rss["self_kib"] / 1024),
        "children_peak_rss_mib": round(rss["children_kib"] / 1024),
        "peak_rss_bound_mib": round(peak),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "tail": done.stderr[-400:] if done.returncode else "",
    }


REFRESH = """
import json, statistics, sys, time
from pathlib import Path
from rich.console import Console
from toolkit.telemetry.watch import _reopen, snapshot
run_dir = Path(sys.argv[1])
console = Console(width=160, file=open("/dev/null", "w"))
t0 = time.perf_counter()
run = _reopen(run_dir, None)
console.print(snapshot(run_dir, run))
first = time.perf_counter() - t0
times = []
for _ in range(5):
    t0 = time.perf_counter()
    run = _reopen(run_dir, run)
    console.print(snapshot(run_dir, run))
    times.append(time.perf_counter() - t0)
print(json.dumps({"first_s": round(first, 2), "refresh_median_s": round(statistics.median(times), 2)}))
"""


def watch_refresh(run: Path) -> dict:
    """The live view's cost: the first snapshot (opening every file) and the median of five
    refreshes with the files kept open (what `watch` does every --refresh-s)."""
    done = subprocess.run(
        [sys.executable, "-c", REFRESH, str(run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    if done.returncode:
        return {"rc": done.returncode, "tail": done.stderr[-300:]}
    return json.loads(done.stdout.strip().splitlines()[-1]) | {
        "load_avg": [round(x, 2) for x in os.getloadavg()]
    }


def clear_summaries(run: Path) -> int:
    files = list((run / "telemetry").glob("*.summary.json"))
    for f in files:
        f.unlink()
    return len(files)


def scale(nodes: int, gpus: int, hours: float, keep: Path | None, jobs: int, stream: str) -> dict:
    from toolkit.telemetry.synthetic import Plan, generate

    tmp = tempfile.TemporaryDirectory()
    run = keep or Path(tmp.name) / "run"
    estimate = BYTES_PER_GPU_HOUR * nodes * gpus * hours
    free = shutil.disk_usage(run.parent if run.parent.exists() else Path(tmp.name)).free
    out: dict = {"nodes": nodes, "gpus_per_node": gpus, "hours": hours, "stream": stream}
    out["estimated_bytes"] = int(estimate)
    out["baseline_full_read"] = BASELINE.get(f"{nodes}x{gpus}x{hours:g}h")
    print(f"estimated {estimate / 1e9:.1f} GB of node files; {free / 1e9:.0f} GB free", flush=True)
    try:
        if not (run / "telemetry").is_dir():
            if estimate > 0.8 * free:
                raise SystemExit(f"not enough disk: need ~{estimate / 1e9:.1f} GB")
            t0 = time.perf_counter()
            plan = Plan(nodes=nodes, gpus_per_node=gpus, duration_s=3600.0 * hours)
            generate(run, plan, jobs=jobs)
            out["generate_s"] = round(time.perf_counter() - t0, 1)
            out["generate_load_avg"] = [round(x, 2) for x in os.getloadavg()]
        files = list((run / "telemetry").glob("*.h5"))
        out["input_bytes"] = sum(p.stat().st_size for p in files)
        print(f"{len(files)} node files, {out['input_bytes'] / 1e9:.2f} GB", flush=True)
        out["summaries_removed"] = clear_summaries(run)
        report = ["report", str(run), "--no-sacct", "--stream", stream]
        for name, cmd in (
            ("report_first", report),
            ("report_cached", report),
            ("watch_once", ["watch", str(run), "--once"]),
        ):
            out[name] = measure(cmd)
            r = out[name]
            print(
                f"{name}: {r['wall_s']:.1f} s, peak RSS {r['self_peak_rss_mib']} MiB "
                f"(+ {r['children_peak_rss_mib']} MiB workers), load {r['load_avg']}, "
                f"rc {r['rc']}",
                flush=True,
            )
        out["watch_refresh"] = watch_refresh(run)
        print(f"watch_refresh: {out['watch_refresh']}", flush=True)
        out["summary_bytes"] = sum(
            p.stat().st_size for p in (run / "telemetry").glob("*.summary.json")
        )
        return out
    finally:
        tmp.cleanup()
