"""Writer benchmark: is the time a background checkpoint write costs training due to the
GIL, or the machine?

    TOOLKIT_CPUS_PER_TASK=1 python -m toolkit.bench.checkpoint writer [--trials 6] [--steps 2]

One rank trains (`--model`, default gpt_125m; synthetic data, one intra-op thread, so a core
is left free, as on a GPU node) and, in rotating order per trial, a window of `--steps` steps runs: with nothing
in the background (the baseline); while a thread of the training process writes a copy of
the model and optimizer state the way the checkpoint writer does (`DirectFile`: O_DIRECT,
xxh3 while writing, SCHED_IDLE); and while a separate process, started once beforehand,
writes the same bytes from shared memory with the same code; and while a thread only copies
the state into CPU buffers (what the checkpoint's staging thread does on CPU). A window ends
when its background work has finished. Lost time = median over trials of (window - baseline window, same trial).
If the thread loses clearly more than the process, the GIL is what costs (a process-based
writer would help); if both lose the same, the cost is the machine's (memory bandwidth, I/O).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from toolkit.bench.checkpoint.shared import (
    RESULT,
    bench_job,
    local_tensors,
    start_trainer,
    train_one_step,
)
from toolkit.bench.ranks import run_ranks

MODES = ("none", "copy", "thread", "process")


def write_copy(tensors: list[Any], path: str) -> None:
    """What the checkpoint writer does with each shard's bytes (no DCP, no manifest)."""
    import torch

    from toolkit.checkpoint.directio import DirectFile
    from toolkit.checkpoint.manifest import new_hash

    f = DirectFile(path, checksum=new_hash())
    for t in tensors:
        f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    f.close()


def _process_writer(jobs: Any, done: Any, tensors: list[Any]) -> None:
    from toolkit.checkpoint.priority import lower_this_thread

    lower_this_thread("idle")
    while (path := jobs.get()) is not None:
        write_copy(tensors, path)
        done.put(path)


def _thread_copy(sources: list[Any], buffers: list[Any]) -> None:
    from toolkit.checkpoint.priority import lower_this_thread

    lower_this_thread("idle")
    for src, dst in zip(sources, buffers, strict=True):
        dst.copy_(src)


def _thread_writer(tensors: list[Any], path: str) -> None:
    from toolkit.checkpoint.priority import lower_this_thread

    lower_this_thread("idle")
    write_copy(tensors, path)


def measure(trials: int, steps: int, out: Path, model: str = "gpt_125m") -> dict[str, Any]:
    """The benchmark in one rank of its own (`writer_worker`); its result."""
    _, job = bench_job(model, checkpoint=False)
    run_ranks(writer_worker, 1, out, job, str(out), trials, steps)
    return json.loads((out / RESULT).read_text())


def writer_worker(rank: int, world: int, job: Any, out_dir: str, trials: int, steps: int) -> None:
    import torch
    import torch.multiprocessing as mp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from toolkit.distributed.init import shutdown_distributed

    out = Path(out_dir)
    trainer, _ = start_trainer(job, out_dir, timeout_s=600)

    for _ in range(2):  # warm-up: allocation, optimizer state
        train_one_step(trainer)
    m, o = get_state_dict(trainer.model, trainer.optimizer)
    live = local_tensors([m, o])
    copy = [t.detach().clone().contiguous().share_memory_() for t in live]
    nbytes = sum(t.numel() * t.element_size() for t in copy)
    ctx = mp.get_context("spawn")
    jobs, done = ctx.Queue(), ctx.Queue()
    writer = ctx.Process(target=_process_writer, args=(jobs, done, copy), daemon=True)
    writer.start()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for trial in range(trials):
            for mode in MODES[trial % len(MODES) :] + MODES[: trial % len(MODES)]:
                path = str(out / f"{mode}.bin")
                t0 = time.perf_counter()
                thread = None
                if mode == "thread":
                    thread = threading.Thread(target=_thread_writer, args=(copy, path))
                    thread.start()
                elif mode == "copy":
                    thread = threading.Thread(target=_thread_copy, args=(live, copy))
                    thread.start()
                elif mode == "process":
                    jobs.put(path)
                for _ in range(steps):
                    train_one_step(trainer)
                if thread is not None:
                    thread.join()
                if mode == "process":
                    done.get()
                times[mode].append(time.perf_counter() - t0)
                print(f"trial {trial} {mode}: {times[mode][-1]:.2f} s", file=sys.stderr, flush=True)
    finally:
        jobs.put(None)
        writer.join(timeout=60)
        shutdown_distributed()
    lost = {
        mode: sorted(a - b for a, b in zip(times[mode], times["none"], strict=True))
        for mode in MODES[1:]
    }
    result = {
        "bytes": nbytes,
        "intra_op_threads": torch.get_num_threads(),
        "window_s": times,
        "lost_s": {k: statistics.median(v) for k, v in lost.items()},
        "lost_per_trial_s": lost,
    }
    (out / RESULT).write_text(json.dumps(result, indent=1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gpt_125m")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-writer-", dir=args.dir) as out:
        return measure(args.trials, args.steps, Path(out), args.model)
