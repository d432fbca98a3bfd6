"""Gil benchmark: how long an async save keeps the training thread from running Python.

python -m toolkit.bench.checkpoint gil [--model gpt_125m] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from toolkit.bench.checkpoint.shared import (
    RESULT,
    bench_job,
    discarding_storage,
    pickle_every_tensor,
    plan_every_save,
    start_trainer,
    train_one_step,
    use_dcp_defaults,
)
from toolkit.bench.ranks import run_ranks

GIL_VARIANTS = ("toolkit", "toolkit-pickle", "toolkit-replan", "dcp", "toolkit-null")


def kept_out_while(busy: Any, tick_s: float = 0.001, slack_s: float = 0.0001) -> float:
    """Seconds the calling thread wanted to run Python and could not, while `busy()`: it
    sleeps `tick_s` at a time and adds up how late it wakes beyond `slack_s` (waiting for
    the GIL or a core)."""
    late = 0.0
    while busy():
        t = time.perf_counter()
        time.sleep(tick_s)
        late += max(0.0, time.perf_counter() - t - tick_s - slack_s)
    return late


def gil_worker(rank: int, world: int, job: Any, out_dir: str, reps: int) -> None:
    """One rank; per repetition and variant: an async save, then the training thread's
    stand-in (`kept_out_while`) until it committed. Variants: the toolkit's save; the same
    pickling every tensor (`pickle_every_tensor`); planning every save afresh
    (`plan_every_save`); DCP's defaults (`use_dcp_defaults`, the baseline); the toolkit's with
    the shard bytes discarded."""
    trainer, device = start_trainer(job, out_dir)
    from toolkit.checkpoint.checkpointer import Checkpointer
    from toolkit.checkpoint.storage import LocalStorage
    from toolkit.distributed.init import shutdown_distributed

    root = Path(out_dir)
    ckpts = {}
    for name in GIL_VARIANTS:
        storage = discarding_storage() if name.endswith("null") else LocalStorage()
        ckpts[name] = Checkpointer(job.checkpoint, root / name, storage, "{}", "bench", device)
        if name == "dcp":
            use_dcp_defaults(ckpts[name])
        elif name == "toolkit-replan":
            plan_every_save(ckpts[name])
        elif name == "toolkit-pickle":
            pickle_every_tensor(ckpts[name])
    for _ in range(2):  # warm-up: allocation, optimizer state
        train_one_step(trainer)
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in ckpts}
    for rep in range(reps + 1):  # the first saves allocate the staging buffers: not counted
        for name, ckpt in ckpts.items():
            t0 = time.perf_counter()
            ckpt.save(trainer.state.step, trainer.model, trainer.optimizer, {"step": 0})
            returned = time.perf_counter() - t0
            pending = ckpt._pending
            staging = kept_out_while(lambda p=pending: p.staged is not None and not p.staged.done())
            rest = kept_out_while(lambda c=ckpt: c.in_flight)
            committed = time.perf_counter() - t0
            ckpt.wait()
            if rep > 0:
                rows[name].append(
                    {
                        "save_returned_s": returned,
                        "kept_out_staging_s": staging,
                        "kept_out_whole_save_s": returned + staging + rest,
                        "committed_s": committed,
                    }
                )
            train_one_step(trainer)  # the next save copies changed tensors
            for p in root.glob(f"{name}/step-*"):
                shutil.rmtree(p, ignore_errors=True)
    for c in ckpts.values():
        c.close()
    (root / RESULT).write_text(json.dumps(rows, indent=1))
    shutdown_distributed()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gpt_125m")
    parser.add_argument("--reps", type=int, default=3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """How long one async save keeps the training thread from running Python (the time
    `save()` takes to return, plus how late a thread that sleeps 1 ms at a time wakes while
    the save is staged and written), with the toolkit's save against DCP's defaults. Medians."""
    overrides, job = bench_job(args.model)
    out_dir = Path(tempfile.mkdtemp(prefix="bench-ckpt-gil-", dir=args.dir))
    try:
        run_ranks(gil_worker, 1, out_dir, job, str(out_dir), args.reps)
        rows = json.loads((out_dir / RESULT).read_text())
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    summary = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for name, runs in rows.items()
    }
    return {"overrides": overrides, "raw": rows, "summary": summary}
