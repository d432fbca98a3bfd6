"""Telemetry benchmarks (step time with telemetry on/off: `python -m toolkit.bench.ab telemetry`) (scripts, not timed tests); figures go to docs/BENCHMARKS.md.

python -m toolkit.bench.telemetry size [--minutes 60]
    bytes per node-hour at 1 s: a synthetic node (8 GPUs, all NVML columns, 4 IB ports,
    8 ranks at 2 steps/s) written by the real writer, and the measured growth of the
    node file of a real CPU run (host only), extrapolated to an hour.
python -m toolkit.bench.telemetry report [--reps 3]
    report time on synthetic 8 nodes x 8 GPUs x 1 hour at 1 s (with and without the
    CSV/trace exports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from toolkit.bench.ab import QUIET, TINY, launch_run


def size(minutes: float) -> dict:
    from toolkit.telemetry.read import load_node, node_files
    from toolkit.telemetry.synthetic import Plan, generate

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        plan = generate(
            Path(tmp) / "syn",
            Plan(
                nodes=1,
                gpus_per_node=8,
                duration_s=60 * minutes,
                straggler_rank=None,
                idle_gap_at_s=None,
            ),
        )
        nbytes = plan.files[0].stat().st_size
        out["synthetic_bytes_per_node_hour"] = nbytes * 60 / minutes
        out["synthetic_minutes"] = minutes
        run_dir = Path(tmp) / "real"
        run = [*TINY, *QUIET, "trainer.steps=300", "telemetry.interval_s=1.0"]
        launch_run(run, 0, run_dir)
        (path,) = node_files(run_dir)
        node = load_node(path)
        span = float(node.host["time"][-1] - node.host["time"][0])
        samples = len(node.host)
        node.close()
        out["real_cpu_run"] = {
            "bytes": path.stat().st_size,
            "host_samples": samples,
            "span_s": span,
            "steps": 300,
        }
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def costs(seconds: float) -> dict:

    from toolkit.config.telemetry import TelemetryConfig
    from toolkit.events import StepRecord
    from toolkit.telemetry.sink import TelemetrySink, start_agent
    from toolkit.telemetry.spec import AgentSpec
    from toolkit.telemetry.transport import socket_path

    def record(rank: int, step: int) -> StepRecord:
        return StepRecord(
            step,
            time.time(),
            0.1,
            0.001,
            0.08,
            0.019,
            2.5,
            1.0,
            3e-4,
            65536,
            655360.0,
            0.41,
            1 << 34,
            rank,
        )

    out: dict = {"seconds": seconds}
    with tempfile.TemporaryDirectory() as tmp:
        for interval in (1.0, 0.1):
            run_dir = Path(tmp) / f"i{interval}"
            cfg = TelemetryConfig(interval_s=interval)
            path = socket_path(run_dir, "bench", "1", 0)
            spec = AgentSpec(
                run_dir=str(run_dir),
                node="bench",
                attempt=0,
                job_id="1",
                node_rank=0,
                ranks=list(range(8)),
                world_size=8,
                num_nodes=1,
                socket=path,
                parent_pid=os.getpid(),
                config=cfg,
            )
            agent = start_agent(spec, run_dir, "bench")
            sinks = [TelemetrySink(cfg, r, path, agent if r == 0 else None) for r in range(8)]
            time.sleep(3.0)  # agent started: imports, file created
            cpu0, t0 = _cpu_seconds(agent.pid), time.monotonic()
            step, per_call = 0, []
            while time.monotonic() - t0 < seconds:
                step += 1
                for sink in sinks:
                    c0 = time.perf_counter()
                    sink.write_step(record(sink.rank, step))
                    per_call.append(time.perf_counter() - c0)
                time.sleep(0.1)
            cpu = _cpu_seconds(agent.pid) - cpu0
            wall = time.monotonic() - t0
            for sink in reversed(sinks):  # the agent's owner (rank 0) last, as in a real run
                sink.close()
            out[f"interval_{interval}s"] = {
                "agent_cpu_s_per_wall_s": cpu / wall,
                "write_step_median_us": 1e6 * statistics.median(per_call),
                "write_step_p99_us": 1e6 * sorted(per_call)[int(0.99 * len(per_call))],
                "records": len(per_call),
                "file_bytes": sum(p.stat().st_size for p in (run_dir / "telemetry").glob("*.h5")),
            }
            print(json.dumps(out[f"interval_{interval}s"]), flush=True)
    return out


def report_speed(reps: int) -> dict:
    from toolkit.config.telemetry import ReportConfig
    from toolkit.telemetry.report.build import build_report
    from toolkit.telemetry.synthetic import Plan, generate

    times: dict[str, list[float]] = {"full": [], "no_export": []}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        generate(Path(tmp), Plan(nodes=8, gpus_per_node=8, duration_s=3600.0))
        gen_s = time.perf_counter() - t0
        for _ in range(reps):
            for name, export in (("full", True), ("no_export", False)):
                t0 = time.perf_counter()
                build_report(Path(tmp), Path(tmp) / name, ReportConfig(sacct=False, export=export))
                times[name].append(time.perf_counter() - t0)
                print(f"report {name}: {times[name][-1]:.2f} s", flush=True)
        sizes = sum(p.stat().st_size for p in (Path(tmp) / "telemetry").glob("*.h5"))
    return {
        "generate_s": gen_s,
        "input_bytes": sizes,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "all_s": times,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.telemetry")
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("size")
    s.add_argument("--minutes", type=float, default=60.0)
    r = sub.add_parser("report")
    r.add_argument("--reps", type=int, default=3)
    c = sub.add_parser("costs")
    c.add_argument("--seconds", type=float, default=30.0)
    for p in (s, r, c):
        p.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.what == "size":
        result = size(args.minutes)
    elif args.what == "costs":
        result = costs(args.seconds)
    else:
        result = report_speed(args.reps)
    from toolkit.measure.results import print_json

    print_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
