"""`python -m toolkit.bench.streams [--reps 3] [--steps 40] [--read-us 400]`: what splitting
an IterableDataset across ranks costs and saves, in 2-rank training runs through the CLI.

The stream (CostlyStream below) spends --read-us microseconds of CPU to read each item, as
a parser or a decoder would. Two variants of the same 2-rank run (model=ts_transformer,
tiny; data.num_workers=1; global batch 32), interleaved per repetition with the order
rotated, after one untimed warm-up run:
  A  the toolkit's default split, every n-th item: each rank's reader still reads the whole
     stream (as every rank did before streams were sharded) and hands over its half
  B  the dataset's own shard(index, count): each reader reads only its half
Per run, from summary.json: the median step time and the data-wait share (steps after the
first). Prints one JSON object: the medians of each variant over the repetitions, and each
run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import IterableDataset

REPO = Path(__file__).resolve().parents[2]


class CostlyStream(IterableDataset):
    """An endless stream of (x [window, num_series], y [num_targets]) pairs, each read with
    `read_us` microseconds of CPU; `own_shard`: it has shard(index, count), and reads only
    the items of its part."""

    def __init__(
        self,
        window: int,
        num_series: int,
        num_targets: int,
        read_us: int = 400,
        own_shard: bool = False,
    ):
        self.shape = (window, num_series, num_targets)
        self.read_s = read_us / 1e6
        self.part = (0, 1)
        if own_shard:
            self.shard = self._shard

    def _shard(self, index: int, count: int) -> None:
        self.part = (index, count)

    def __iter__(self):
        window, num_series, num_targets = self.shape
        index, count = self.part
        i = index
        while True:
            end = time.perf_counter() + self.read_s  # the read: CPU, not a sleep
            while time.perf_counter() < end:
                pass
            g = torch.Generator().manual_seed(i)
            yield (
                torch.randn(window, num_series, generator=g),
                torch.randn(num_targets, generator=g),
            )
            i += count


def run(variant: str, steps: int, read_us: int, root: Path) -> dict[str, float]:
    run_dir = root / f"{variant}-{time.monotonic_ns()}"
    overrides = [
        "model=ts_transformer",
        "model.num_series=4",
        "model.num_targets=1",
        "model.num_layers=1",
        "model.dim=32",
        "model.num_heads=2",
        "data=dataset",
        "data._target_=toolkit.bench.streams.CostlyStream",
        "+data.window=16",
        "+data.num_series=4",
        "+data.num_targets=1",
        "+data.seq_len=16",
        "+data.num_workers=1",
        f"+data.read_us={read_us}",
        f"+data.own_shard={variant == 'B'}",
        f"trainer.steps={steps}",
        "trainer.global_batch_size=32",
        "trainer.eval_batches=0",
        "trainer.progress=false",
        "launch.follow=false",
        "cluster.tasks_per_node=2",
        f"hydra.run.dir={run_dir}",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "toolkit.launch", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "step_ms": 1000 * summary["median_step_time_s"],
        "data_wait_share": summary["data_wait_share"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--read-us", type=int, default=400)
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        run("A", 5, args.read_us, Path(tmp))  # warm-up: page cache, compiled kernels
        for rep in range(args.reps):
            for variant in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                results[variant].append(run(variant, args.steps, args.read_us, Path(tmp)))
    out = {
        variant: {
            key: statistics.median(r[key] for r in runs) for key in ("step_ms", "data_wait_share")
        }
        for variant, runs in results.items()
    }
    out["runs"] = results  # each repetition's, in order
    out["settings"] = vars(args)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
