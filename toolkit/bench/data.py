"""`python -m toolkit.bench.data [--workers 1 2 4] [--formats hdf5 parquet npy] [OVERRIDE ...]`:
does the loader keep the accelerator fed?

`--paths [--repeats 7] [--min-s 1]`: the sample paths side by side on the first format, interleaved
(host loader, device-resident, plain gather; again, ...), medians of samples/s: the host
loader with the first --workers count (toolkit.data.loader), the device-resident path
(toolkit.data.device, data.placement=device: on this machine's first accelerator, else the
CPU), and, as the bound, one plain gather of the same windows' inputs out of an in-memory
tensor per micro-batch (no order, normalisation or targets).

For each format, writes the synthetic market (--times x --instruments x 3 features) to a
temporary directory, then for each worker count times one rank's loader of the composed
job (default experiment=returns; e.g. `hardware=h100 precision=bf16` for a GPU node):
samples/s and MB/s of batches delivered, after --warmup steps (worker start-up excluded).
The step rate the model needs comes from the performance model (toolkit.perfmodel) for the
same job: a rank must deliver micro_batch x grad_accum samples per predicted step time.
Prints one JSON object (and writes it to --json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from toolkit.config.data import order_seed
from toolkit.config.model import display_name

FEATURES = 3  # toolkit.data.synthetic.FEATURES


def measure(loader, warmup: int, steps: int) -> dict[str, float]:
    for _ in range(warmup):
        next(loader)
    delivered = 0
    start = time.perf_counter()
    for _ in range(steps):
        _, batches = next(loader)
        delivered += sum(x.nbytes + y.nbytes for x, y in batches)
    elapsed = time.perf_counter() - start
    loader.close()
    samples = steps * loader.plan.micro_batch_size * loader.plan.grad_accum
    return {
        "samples_per_s": samples / elapsed,
        "mb_per_s": delivered / elapsed / 1e6,
        "steps_per_s": steps / elapsed,
    }


class GatherBound:
    """A plain in-memory gather, loader-like: step s's micro-batches are the windows of the
    same anchors the device path cuts (the sample order's first `steps` steps, cycled),
    each one index_select of the inputs table's rows, as the device path's; no order
    lookup, no targets."""

    def __init__(self, windows, plan, steps: int, device):
        import torch

        inputs = windows.device_tables(device)[0]
        self.table = inputs.reshape(len(inputs), -1)
        self.plan = plan
        self.steps = steps
        g = plan.global_batch_size
        rows, _ = windows.keys(windows.order.ids(0, steps * g))
        self.anchors = torch.from_numpy(rows).to(device)
        self.lookback = windows.spec.lookback
        self.offsets = torch.arange(1 - self.lookback, 1, device=device)
        self.step = 0

    def __next__(self):
        p = self.plan
        s = self.step % self.steps
        self.step += 1
        out = []
        for m in range(p.grad_accum):
            lo = s * p.global_batch_size + m * p.micro_batch_size
            rows = self.anchors[lo : lo + p.micro_batch_size]
            window = (rows[:, None] + self.offsets).view(-1)
            x = self.table.index_select(0, window).view(len(rows), self.lookback, -1)
            out.append((x, rows))
        return s, out

    def close(self) -> None:
        pass


def bench_device():
    """The first accelerator, else the CPU."""
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def compare_paths(cfg, plan, width: int, targets: int, args) -> dict:
    """Interleaved repetitions of the three paths; samples/s of each, medians and ratios."""
    import torch

    device = bench_device()
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)  # 2 threads on a loaded 2-core VM spin: 15x slower
    try:
        return measure_paths(cfg, plan, width, targets, args, device)
    finally:
        torch.set_num_threads(threads)


def measure_paths(cfg, plan, width: int, targets: int, args, device) -> dict:
    import statistics

    import torch

    from toolkit.data.device import market_loaders
    from toolkit.data.loader import build_loaders

    start = time.perf_counter()
    on_device, _, placement = market_loaders(
        dataclasses.replace(cfg, placement="device"), plan, width, targets, device, False
    )
    next(on_device)  # the tables: read, normalised and placed once
    setup_s = time.perf_counter() - start
    bound = GatherBound(on_device.windows, plan, args.steps, device)
    rates: dict[str, list[float]] = {"host_loader": [], "device_resident": [], "gather_bound": []}
    for _ in range(args.repeats):
        host, _ = build_loaders(cfg, plan, width, targets, pin_memory=False)
        for name, loader in (("host_loader", host), ("device_resident", on_device)):
            rates[name].append(timed(loader, args.warmup, args.steps, device, args.min_s))
        host.close()
        rates["gather_bound"].append(timed(bound, args.warmup, args.steps, device, args.min_s))
    on_device.close()
    median = {name: statistics.median(r) for name, r in rates.items()}
    return {
        "device": str(device),
        "placement": placement.line,
        "workers": cfg.num_workers,
        "setup_s": setup_s,
        "repeats": args.repeats,
        "samples_per_s": rates,
        "median_samples_per_s": median,
        "device_over_host": median["device_resident"] / median["host_loader"],
        "device_over_bound": median["device_resident"] / median["gather_bound"],
        "torch_threads": torch.get_num_threads(),
    }


def timed(loader, warmup: int, steps: int, device, min_s: float) -> float:
    """Samples/s after `warmup` steps, over rounds of `steps` steps until `min_s` seconds
    have passed (the loader stays open: the host loader's workers start once per repetition,
    in its warm-up)."""
    import torch

    for _ in range(warmup):
        next(loader)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    samples = 0
    while not samples or time.perf_counter() - start < min_s:
        for _ in range(steps):
            _, batches = next(loader)
            samples += sum(len(b[0]) for b in batches)
        sync()
    return samples / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.data")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--formats", nargs="+", default=["hdf5", "parquet", "npy"])
    parser.add_argument("--times", type=int, default=50_000)
    parser.add_argument("--instruments", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the datasets")
    parser.add_argument("--paths", action="store_true", help="host vs device vs plain gather")
    parser.add_argument("--repeats", type=int, default=7, help="--paths: interleaved rounds")
    parser.add_argument("--min-s", type=float, default=1.0, help="--paths: seconds per timing")
    parser.add_argument(
        "--threads", type=int, default=1, help="--paths: torch threads (1: one core, as numpy)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    from toolkit.config.compose import compose_raw, to_job
    from toolkit.config.errors import ConfigError
    from toolkit.config.shape import micro_batch_size, world_size
    from toolkit.config.validate import validate
    from toolkit.data.loader import SamplePlan, build_loaders
    from toolkit.data.synthetic import write_synthetic
    from toolkit.perfmodel import predict_job

    n = args.instruments
    shape = [f"data.synthetic_instruments={n}"]
    overrides = ["experiment=returns", *shape, *args.overrides]
    try:
        job = to_job(compose_raw(overrides))
        width, targets = (n * FEATURES, n) if job.data.sample == "cross_section" else (FEATURES, 1)
        job.model.num_series, job.model.num_targets = width, targets
        validate(job)
    except ConfigError as exc:
        print("\n".join(f"error: {line}" for line in exc.problems), file=sys.stderr)
        return 2
    world = world_size(job.cluster)
    plan = SamplePlan(
        order_seed(job.data, job.seed),
        job.data.seq_len,
        micro_batch_size(job.trainer, world),
        job.trainer.grad_accum,
        world,
        0,
    )
    prediction = predict_job(job)
    need = plan.micro_batch_size * plan.grad_accum / prediction.step_s
    root = Path(tempfile.mkdtemp(prefix="bench-data-", dir=args.dir))
    results = []
    if args.paths:
        fmt = args.formats[0]
        write_synthetic(root / fmt, args.times, n, fmt)
        cfg = dataclasses.replace(job.data, path=str(root / fmt), num_workers=args.workers[0])
        paths = compare_paths(cfg, plan, width, targets, args)
        print(json.dumps(paths), file=sys.stderr)
        args.formats = []  # the per-format table is the plain command's
    for fmt in args.formats:
        path = root / fmt
        write_synthetic(path, args.times, n, fmt)
        size = sum(p.stat().st_size for p in path.iterdir())
        for workers in args.workers:
            cfg = dataclasses.replace(job.data, path=str(path), num_workers=workers)
            loader, _ = build_loaders(cfg, plan, width, targets, pin_memory=False)
            row = {"format": fmt, "workers": workers, "dataset_mb": size / 1e6}
            row.update(measure(loader, args.warmup, args.steps))
            row["keeps_up"] = row["samples_per_s"] >= need
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    out = {
        "job": {
            "overrides": overrides,
            "model": display_name(job.model),
            "hardware": job.hardware.name,
            "precision": job.precision.name,
            "world_size": world,
            "micro_batch_size": plan.micro_batch_size,
            "grad_accum": plan.grad_accum,
            "seq_len": job.data.seq_len,
            "sample": job.data.sample,
        },
        "dataset": {"times": args.times, "instruments": n, "features": FEATURES},
        "predicted_step_s": prediction.step_s,
        "needed_samples_per_s_per_rank": need,
        "cpus": os.cpu_count(),
        "results": results,
    }
    if args.paths:
        out["paths"] = paths
    from toolkit.measure.results import print_json

    print_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
