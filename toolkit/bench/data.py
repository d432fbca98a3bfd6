"""`python -m toolkit.bench.data [--workers 1 2 4] [--formats hdf5 parquet npy] [OVERRIDE ...]`:
does the loader keep the accelerator fed?

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.data")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--formats", nargs="+", default=["hdf5", "parquet", "npy"])
    parser.add_argument("--times", type=int, default=50_000)
    parser.add_argument("--instruments", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the datasets")
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
        job.seed,
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
    from toolkit.measure.results import print_json

    print_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
