"""`python -m toolkit.bench.user_data [--workers 0 2] [--rounds 5] [--steps 40]`: what the
user-dataset loader (toolkit.data.user: seeded epochs, world-size-independent global batches,
resumable) costs against a plain torch DataLoader over the same Dataset.

The Dataset is toolkit.data.WindowedSamples over --samples random windows [--window,
--width] written to a temporary .npz. Both loaders deliver batches of --batch samples with
the default collate and the same worker count; A (toolkit) and B (plain DataLoader, the
baseline below) alternate --rounds times, each timing --steps batches after worker start-up
and one warm-up batch. Prints one JSON object: median samples/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def plain_loader(dataset, batch: int, workers: int, seed: int):
    """The baseline: torch's DataLoader with a seeded shuffle, nothing else."""
    import torch
    from torch.utils.data import DataLoader

    g = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset, batch_size=batch, shuffle=True, generator=g, num_workers=workers, drop_last=True
    )


def toolkit_loader(dataset_path: Path, batch: int, workers: int, seed: int):
    from toolkit.config.data import DatasetConfig
    from toolkit.config.shape import BatchShape
    from toolkit.data.user import build_loaders

    cfg = DatasetConfig(
        target="toolkit.data.WindowedSamples",
        kwargs={"path": str(dataset_path)},
        num_workers=workers,
    )
    plan = BatchShape(
        seed=seed, seq_len=1, micro_batch_size=batch, grad_accum=1, world_size=1, rank=0
    )
    return build_loaders(cfg, plan, pin_memory=False)[0]


def time_batches(batches, steps: int) -> float:
    """Samples/s over `steps` batches, after one warm-up batch (worker start-up excluded)."""
    next(batches)
    start = time.perf_counter()
    n = 0
    for _ in range(steps):
        item = next(batches)
        micro = item[1][0] if isinstance(item, tuple) and isinstance(item[0], int) else item
        n += len(micro[0])
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.user_data")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--width", type=int, default=48)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from toolkit.data.windowed import WindowedSamples

    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "samples.npz"
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.samples, args.window, args.width), dtype=np.float32)
        np.savez(path, X=x, y=rng.standard_normal(args.samples).astype(np.float32))
        dataset = WindowedSamples(path=str(path))
        for workers in args.workers:
            a, b = [], []
            for r in range(args.rounds):  # interleaved: A, B, A, B, ...
                loader = toolkit_loader(path, args.batch, workers, seed=r)
                a.append(time_batches(loader, args.steps))
                loader.close()
                b.append(
                    time_batches(iter(plain_loader(dataset, args.batch, workers, r)), args.steps)
                )
            out[f"workers={workers}"] = {
                "toolkit_samples_per_s": statistics.median(a),
                "plain_samples_per_s": statistics.median(b),
                "ratio_toolkit_over_plain": statistics.median(
                    x / y for x, y in zip(a, b, strict=True)
                ),
            }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
