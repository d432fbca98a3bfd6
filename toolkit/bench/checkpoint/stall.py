"""Stall benchmark: training stall per checkpoint (async vs blocking DCP save of the same
state) and save throughput against the disk's raw write speed.

    python -m toolkit.bench.checkpoint stall [--model gpt_125m] [--ranks 2] [--trials 5]

Stall (the windows: toolkit.bench.checkpoint.windows): in each trial the same ranks run N
steps several ways, in rotating order, each between two windows of N steps without a
checkpoint: an async save (`Checkpointer.save`, the training hook's code path) after the
first step, once per variant (`--variants`); a blocking `dcp.save` (the baseline,
`sync_dcp_save`) after the first step. An async window ends when its save has committed, so
a save still running after the last step counts as lost time. Lost time per checkpoint =
median over trials of (window with it - the mean of the windows without a checkpoint right
before and after it). Baselines in the same rotation (toolkit.bench.checkpoint.baselines):
`BackgroundRawWrite` (copy + a plain write of the same bytes in a thread: the least any
async checkpoint can cost) and `sync_dcp_save`. With `--neighbour-cpu-s S`, also a window in
which another process copies memory for S CPU seconds (`Neighbour`): what that much work
beside training costs it on this machine, to set against the async save's own CPU seconds
(`save_cpu_s`). With `--baselines-every K`, the two baselines run in every K-th trial only,
leaving the time for more trials of the async variants.
Raw write: each rank writes its shard's bytes with plain file writes + fsync (the baseline
`shared.raw_write`), concurrently, on the same disk, in the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from toolkit.bench.checkpoint.baselines import Neighbour
from toolkit.bench.checkpoint.shared import (
    RESULT,
    bench_job,
    discarding_storage,
    local_tensors,
    pickle_every_tensor,
    raw_write,
    start_trainer,
    train_one_step,
    use_dcp_defaults,
)
from toolkit.bench.checkpoint.windows import run_trials
from toolkit.bench.ranks import run_ranks
from toolkit.hooks import Hook


class _WaitStaged(Hook):
    def __init__(self, ckpts: list[Any]):
        self.ckpts = ckpts

    def before_optimizer_step(self, trainer: Any) -> None:
        for c in self.ckpts:
            c.wait_staged()


def stall_worker(
    rank: int,
    world: int,
    job: Any,
    out_dir: str,
    trials: int,
    steps: int,
    variants: list[str],
    neighbour_cpu_s: float = 0.0,
    baselines_every: int = 1,
) -> None:
    trainer, device = start_trainer(job, out_dir)
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from toolkit.checkpoint.checkpointer import Checkpointer
    from toolkit.checkpoint.storage import LocalStorage
    from toolkit.distributed.init import shutdown_distributed

    root = Path(out_dir)
    ckpts = {}
    for variant in variants:  # "<priority>:<overlap|copy>[:<direct|buffered|null>[:dcp|pickle]]"
        priority, staging, io, save_path = (variant + ":direct:toolkit").split(":")[:4]
        cfg = replace(
            job.checkpoint,
            writer_priority=priority,
            overlap_staging=staging == "overlap",
            direct_io=io == "direct",
        )
        suffix = {"dcp": "-dcpdefaults", "pickle": "-pickle"}.get(save_path, "")
        name = f"async-{priority}-{staging}-{io}{suffix}"
        storage = discarding_storage() if io == "null" else LocalStorage(cfg.direct_io)
        ckpts[name] = Checkpointer(cfg, root / f"ckpt-{name}", storage, "{}", "bench", device)
        if save_path == "dcp":
            use_dcp_defaults(ckpts[name])
        elif save_path == "pickle":
            pickle_every_tensor(ckpts[name])
    # What the checkpoint hook does in the loop: an overlapped copy finishes before the
    # optimizer step changes the state.
    trainer.hooks.append(_WaitStaged(list(ckpts.values())))
    for _ in range(2):  # warm-up: allocation, optimizer state
        train_one_step(trainer)
    neighbour = Neighbour(job.checkpoint.writer_priority) if neighbour_cpu_s > 0 else None
    w = run_trials(
        trainer, ckpts, root, rank, trials, steps, neighbour, neighbour_cpu_s, baselines_every
    )
    m, o = get_state_dict(trainer.model, trainer.optimizer)
    local = local_tensors({"model": m, "optim": o})
    dist.barrier()
    raw_bytes, raw_s = raw_write(local, root / "raw" / f"rank{rank}.bin")
    dist.barrier()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"raw_bytes": raw_bytes, "raw_s": raw_s})
    for c in ckpts.values():
        c.close()
    if neighbour is not None:
        neighbour.close()
    if rank == 0:
        total_raw = sum(g["raw_bytes"] for g in gathered)
        slowest_raw = max(g["raw_s"] for g in gathered)
        result = {
            "world_size": world,
            "steps_per_window": steps,
            "trials": trials,
            "window_s": w.times,
            "reference": w.reference,
            "async_saves": w.saves,
            "sync_save_s": w.sync_s,
            "raw_background": w.raw_bg,
            "neighbour_cpu_s": w.neighbour_used,  # rank 0's neighbour
            "cpu_s": w.cpu,
            "checkpoint_bytes": max(s["size_bytes"] for v in w.saves.values() for s in v),
            "raw_write": {"bytes": total_raw, "seconds": slowest_raw},
        }
        (root / RESULT).write_text(json.dumps(result, indent=1))
    shutil.rmtree(root / "raw", ignore_errors=True)
    for p in root.glob("ckpt-*"):
        shutil.rmtree(p, ignore_errors=True)
    shutdown_distributed()


def summarize_stall(r: dict[str, Any]) -> dict[str, Any]:
    med = {k: statistics.median(v) for k, v in r["window_s"].items()}
    # Lost time: the median over trials of (window with it - the mean of the two windows
    # without a checkpoint right before and after it), which cancels the machine's drift.
    ref = r["reference"]
    paired = {
        k: statistics.median(
            a - b["window_s"] for a, b in zip(r["window_s"][k], ref[k], strict=True)
        )
        for k in ref
    }
    size = r["checkpoint_bytes"]
    sync = statistics.median(r["sync_save_s"])
    out: dict[str, Any] = {
        "checkpoint_GB": size / 1e9,
        "median_window_s": med,
        "sync_dcp_save_s": sync,
        "sync_save_GBps": size / 1e9 / sync,
        "lost_sync_s": paired["sync"],
        "raw_write_GBps": r["raw_write"]["bytes"] / 1e9 / r["raw_write"]["seconds"],
        "lost_raw_background_s": paired["raw-bg"],
        "raw_background_staging_s": statistics.median(x["staging_s"] for x in r["raw_background"]),
        "raw_background_write_s": statistics.median(x["write_s"] for x in r["raw_background"]),
        # median CPU seconds per window by kind (machine-wide; this_process = rank 0)
        "median_cpu_s": {
            mode: {k: statistics.median(w[k] for w in windows) for k in windows[0]}
            for mode, windows in r["cpu_s"].items()
        },
    }
    own_cpu = {  # rank 0's process, paired with the windows without a checkpoint around it
        k: statistics.median(
            w["this_process"] - b["cpu_s"]["this_process"]
            for w, b in zip(r["cpu_s"][k], ref[k], strict=True)
        )
        for k in ref
    }
    if r.get("neighbour_cpu_s"):
        used = statistics.median(r["neighbour_cpu_s"])
        out["neighbour"] = {
            "cpu_s": used,
            "lost_s": paired["neighbour"],
            "lost_per_cpu_s": paired["neighbour"] / used,
        }
    for mode, saves in r["async_saves"].items():
        lost = paired[mode]
        write = statistics.median(s["write_s"] for s in saves)
        out[mode] = {
            "lost_s": lost,
            "lost_over_sync_save": lost / sync,
            "lost_over_lost_sync": lost / out["lost_sync_s"],
            "lost_over_lost_raw_background": lost / out["lost_raw_background_s"],
            "blocked_s": statistics.median(s["stall_s"] for s in saves),
            "blocked_over_sync_save": statistics.median(s["stall_s"] for s in saves) / sync,
            "background_write_s": write,
            "checksum_s": statistics.median(s["checksum_s"] for s in saves),
            "commit_s": statistics.median(s["commit_s"] for s in saves),
            "tail_wait_s": statistics.median(s["tail_wait_s"] for s in saves),
            "save_GBps": size / 1e9 / write,
            # the save's own CPU seconds on rank 0 (its process's CPU time in the window
            # minus that in the same trial's window without a checkpoint)
            "save_cpu_s": own_cpu[mode],
            "lost_per_save_cpu_s": lost / own_cpu[mode] if own_cpu[mode] > 0 else None,
        }
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gpt_125m")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument(
        "--variants",
        default="idle:overlap:direct,idle:overlap:buffered",
        help="async modes, each <checkpoint.writer_priority>:<overlap|copy>[:<direct|buffered|null>"
        "[:dcp|pickle]] (overlap_staging, direct_io; default direct; null: DCP's whole save path,"
        " but the shard bytes are discarded instead of written; dcp: DCP's defaults, its own"
        " stager (whose copies hold the GIL), a fresh plan every save and every tensor pickled,"
        " instead of the toolkit's; pickle: the toolkit's save with every tensor pickled)",
    )
    parser.add_argument(
        "--neighbour-cpu-s",
        type=float,
        default=0.0,
        help="also a window in which another process copies memory for this many CPU seconds"
        " (per rank, at the writer's priority; `Neighbour`): what that much CPU work beside"
        " training costs it on this machine. Set it to an async save's CPU seconds (the"
        " summary's save_cpu_s); 0: off",
    )
    parser.add_argument(
        "--baselines-every",
        type=int,
        default=1,
        help="measure the blocking save and the plain background write in every N-th trial"
        " only (more trials of the async variants in the same time; the blocking save's lost"
        " time varies far less than theirs)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides, job = bench_job(args.model, args.seq_len, args.global_batch)
    out_dir = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        run_ranks(
            stall_worker,
            args.ranks,
            out_dir,
            job,
            str(out_dir),
            args.trials,
            args.steps,
            args.variants.split(","),
            args.neighbour_cpu_s,
            args.baselines_every,
        )
        raw = json.loads((out_dir / RESULT).read_text())
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return {"overrides": overrides, "raw": raw, "summary": summarize_stall(raw)}
