"""`python -m toolkit.bench.user_data [--workers 0 2] [--rounds 5] [--steps 40]`: what the
user-dataset loader (toolkit.data.user: seeded epochs, world-size-independent global batches,
resumable) costs against a plain torch DataLoader over the same Dataset.

The Dataset is toolkit.data.WindowedSamples over --samples random windows [--window,
--width] written to a temporary .npz. Both loaders deliver batches of --batch samples with
the default collate and the same worker count; A (toolkit) and B (plain DataLoader, the
baseline below) alternate --rounds times, each timing --steps batches after worker start-up
and one warm-up batch. Prints one JSON object: median samples/s of each and their ratio.

`--tokens [--data text synthetic]`: the built-in token data on the shared loader path
(toolkit.data.tokens.TokenLoader, data.num_workers DataLoader workers) against the loader
it replaced (ThreadPrefetch below, the baseline: one daemon thread `prefetch` steps ahead),
in the training loop itself: model=gpt_tiny trains --steps steps in this process (one-rank
gloo group) with A's or B's loader, alternating --rounds times. Reports the median step
time, data wait and tokens/s after --warmup steps, and the median of per-round A/B ratios;
then what `next(loader)` alone costs the training thread (median microseconds over 200
steps, 2 ms apart so that prefetching keeps up): 2 workers, 0 workers, the thread.
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


class ThreadPrefetch:
    """The baseline for --tokens: the token loader before issue 33 (toolkit.train.data.Loader,
    deleted with it): a daemon thread computes BatchPlan.micro_batches `prefetch` steps
    ahead into a queue. Only what the Trainer calls (toolkit.data.loader.Loader)."""

    def __init__(self, source, plan, prefetch: int = 2, split: str = "train"):
        self.source, self.plan, self.prefetch, self.split = source, plan, prefetch, split
        self.next_step = 0
        self._queue = None
        self._stop = None
        self._thread = None

    def _produce(self, step: int) -> None:
        import queue

        while not self._stop.is_set():
            item = (step, self.plan.micro_batches(self.source, self.split, step))
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            step += 1

    def __next__(self):
        import queue
        import threading

        if self._thread is None:
            self._stop, self._queue = threading.Event(), queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(
                target=self._produce, args=(self.next_step,), daemon=True
            )
            self._thread.start()
        step, batches = self._queue.get()
        self.next_step = step + 1
        return step, batches

    def batch(self, step: int):
        return self.plan.micro_batches(self.source, self.split, step)

    def state_dict(self):
        return {"next_step": self.next_step, "seed": self.plan.seed}

    def load_state_dict(self, state) -> None:
        self.close()
        self.next_step = int(state["next_step"])

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None


def train_with(loader: str, data: str, steps: int, run_dir: Path) -> list:
    """The StepRecords of `steps` gpt_tiny steps on `data` with the toolkit's loader ("toolkit")
    or the thread baseline ("thread")."""
    import torch

    from toolkit.config.compose import compose_raw, to_job
    from toolkit.distributed.env import DistEnv
    from toolkit.tasks.train import build_trainer

    overrides = ["model=gpt_tiny", f"data={data}", "data.seq_len=64", f"trainer.steps={steps}"]
    overrides += ["trainer.micro_batch_size=8", "trainer.eval_batches=0", "telemetry=off"]
    overrides += ["trainer.progress=false", "checkpoint.enabled=false"]
    job = to_job(compose_raw(overrides))
    trainer = build_trainer(
        job, DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 0), run_dir, torch.device("cpu")
    )
    if loader == "thread":
        new = trainer.loader
        trainer.loader = ThreadPrefetch(new.source, new.plan, job.data.prefetch)
    try:
        trainer.fit()
    finally:
        trainer.sink.close()
    return trainer.records


def next_cost_us(loader, steps: int = 200) -> float:
    """Median microseconds of `next(loader)` with the batches prepared ahead."""
    next(loader)
    took = []
    for _ in range(steps):
        time.sleep(0.002)
        start = time.perf_counter()
        next(loader)
        took.append(time.perf_counter() - start)
    loader.close()
    return statistics.median(took) * 1e6


def delivery(data: str, rounds: int) -> dict[str, float]:
    from toolkit.config.data import DataConfig
    from toolkit.data.tokens import BatchPlan, TokenLoader, open_sources

    source = open_sources(DataConfig(kind=data), 256)["train"]
    plan = BatchPlan(0, 64, 8, 1, 1, 0)  # what train_with's job reads per step
    variants = {
        "workers2": lambda: TokenLoader(source, plan, num_workers=2),
        "workers0": lambda: TokenLoader(source, plan, num_workers=0),
        "thread": lambda: ThreadPrefetch(source, plan),
    }
    took = {name: [next_cost_us(make()) for _ in range(1)] for name, make in variants.items()}
    for _ in range(rounds - 1):  # interleaved
        for name, make in variants.items():
            took[name].append(next_cost_us(make()))
    return {f"next_us_{name}": statistics.median(t) for name, t in took.items()}


def tokens(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    import torch.distributed as dist

    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            for data in args.data:
                rows: dict[str, list[dict[str, float]]] = {"toolkit": [], "thread": []}
                for r in range(args.rounds):  # interleaved: A, B, A, B, ...
                    for name in rows:
                        run_dir = Path(tmp) / f"{data}-{name}-{r}"
                        kept = train_with(name, data, args.warmup + args.steps, run_dir)
                        kept = kept[args.warmup :]
                        rows[name].append(
                            {
                                "step_s": statistics.median(x.step_time_s for x in kept),
                                "data_wait_s": statistics.median(x.data_wait_s for x in kept),
                                "tokens_per_s": statistics.median(x.tokens_per_s for x in kept),
                            }
                        )
                a, b = rows["toolkit"], rows["thread"]
                out[f"data={data}"] = {
                    **{
                        f"{name}_{key}": statistics.median(x[key] for x in rows[name])
                        for name in rows
                        for key in ("step_s", "data_wait_s", "tokens_per_s")
                    },
                    "ratio_tokens_per_s_toolkit_over_thread": statistics.median(
                        x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(a, b, strict=True)
                    ),
                    **delivery(data, args.rounds),
                }
        finally:
            dist.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.user_data")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--width", type=int, default=48)
    parser.add_argument("--tokens", action="store_true", help="token data: workers vs thread")
    parser.add_argument("--data", nargs="+", default=["text", "synthetic"])
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.tokens:
        print(json.dumps(tokens(args), indent=1))
        return 0
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
