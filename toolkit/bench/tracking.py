"""Experiment-tracker costs (step time on/off: `python -m toolkit.bench.ab tracking`; a script, not a timed test); figures go to docs/BENCHMARKS.md.

python -m toolkit.bench.tracking costs [--records 2000]
    what one write_step costs the training thread per tracker (median and p99, in
    microseconds), with the tracker's worker running, and the CPU the worker spends per
    record after its start (and the start's own cost): together the bound on the overhead per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def costs(records: int) -> dict:
    from toolkit.config.tracking import TrackingConfig
    from toolkit.events import StepRecord
    from toolkit.tracking.base import Params, TrackerSink
    from toolkit.tracking.build import build_tracker

    out: dict = {"records": records}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tensorboard", "mlflow", "wandb"):
            run_dir = Path(tmp) / name
            cfg = TrackingConfig(**{name: True}, queue_size=records + 1)
            params = Params({"model.name": "bench"}, ["tracking=" + name], name)
            tracker = build_tracker(name, cfg, run_dir)
            sink = TrackerSink(tracker, params, records + 1, 200, 120.0, cfg.flush_interval_s)
            per_call = []
            t0, cpu0 = time.perf_counter(), time.process_time()
            while not sink.opened and sink.error is None and time.perf_counter() - t0 < 120:
                time.sleep(0.01)  # the worker's start: imports, the store, the service
            start_s, start_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
            cpu0, main0 = time.process_time(), time.thread_time()
            for step in range(1, records + 1):
                record = StepRecord(
                    step, time.time(), 0.1, 1e-3, 0.08, 0.019, 2.5, 1.0, 3e-4, 65536, 6.5e5, 0.4, 0
                )
                t0 = time.perf_counter()
                sink.write_step(record)
                per_call.append(time.perf_counter() - t0)
                if step % 10 == 0:
                    time.sleep(0.001)  # steps take time: let the worker run between them
            t0 = time.perf_counter()
            result = sink.close()
            # CPU the tracker's worker (and its library's threads) used, per record.
            worker_cpu_s = (time.process_time() - cpu0) - (time.thread_time() - main0)
            per_call.sort()
            out[name] = {
                "write_step_median_us": 1e6 * statistics.median(per_call),
                "write_step_p99_us": 1e6 * per_call[int(0.99 * len(per_call))],
                "start_s": start_s,
                "start_cpu_s": start_cpu_s,
                "close_s": time.perf_counter() - t0,
                "worker_cpu_us_per_record": 1e6 * worker_cpu_s / records,
                "dropped": result["dropped"],
                "error": result["error"],
            }
            print(name, out[name], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.tracking")
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("costs")
    c.add_argument("--records", type=int, default=2000)
    for p in (c,):
        p.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = costs(args.records)
    from toolkit.measure.results import print_json

    print_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
