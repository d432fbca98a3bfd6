"""Checkpoint benchmark: training stall per checkpoint (async vs blocking DCP save of the
same state), save throughput against the disk's raw write speed, and time from job start to
the first resumed step as checkpoints grow.

    python -m toolkit.bench.checkpoint stall  [--model gpt_125m] [--ranks 2] [--trials 5]
    python -m toolkit.bench.checkpoint resume [--models gpt_tiny,gpt_small,gpt_125m]
    python -m toolkit.bench.checkpoint cpu    [--gb 1] [--reps 3]
    python -m toolkit.bench.checkpoint gil    [--model gpt_125m] [--reps 3]

Stall: in each trial the same ranks run N steps several ways, in rotating order, each
between two windows of N steps without a checkpoint: an async save (`Checkpointer.save`, the
training hook's code path) after the first step, once per variant (`--variants`); a blocking
`dcp.save` (the baseline, `sync_dcp_save`) after the first step. An async window ends when
its save has committed, so a save still running after the last step counts as lost time.
Lost time per checkpoint = median over trials of (window with it - the mean of the windows
without a checkpoint right before and after it). Baselines in the same rotation:
`BackgroundRawWrite` (copy + a plain write of the same bytes in a thread: the least any
async checkpoint can cost) and `sync_dcp_save`. With `--neighbour-cpu-s S`, also a window in
which another process copies memory for S CPU seconds (`Neighbour`): what that much work
beside training costs it on this machine, to set against the async save's own CPU seconds
(`save_cpu_s`). With `--baselines-every K`, the two baselines run in every K-th trial only,
leaving the time for more trials of the async variants.
Raw write: each rank writes its shard's bytes with plain file writes + fsync (baseline code
below, `raw_write`), concurrently, on the same disk, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from toolkit.hooks import Hook

RESULT = "bench-checkpoint.json"


# -- baselines ----------------------------------------------------------------------------
def sync_dcp_save(state: dict[str, Any], path: Path, pg: Any) -> float:
    """Baseline: a plain blocking DCP save of the same state (no manifest, no checksums)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    t0 = time.perf_counter()
    dcp.save(state, storage_writer=FileSystemWriter(path), process_group=pg)
    return time.perf_counter() - t0


def raw_write(tensors: list[Any], path: Path) -> tuple[int, float]:
    """Baseline: the same bytes as this rank's shard, written with plain file writes + fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    size = 0
    with open(path, "wb") as f:
        for t in tensors:
            view = memoryview(
                t.detach().cpu().contiguous().view(-1).view(__import__("torch").uint8).numpy()
            )
            f.write(view)
            size += view.nbytes
        f.flush()
        os.fsync(f.fileno())
    return size, time.perf_counter() - t0


class BackgroundRawWrite:
    """Baseline for the lost time: the simplest async checkpoint. Copy this rank's
    tensors into one CPU buffer on the training thread, then write it with plain file
    writes + fsync in a thread (no DCP, no checksums, no manifest)."""

    def __init__(self, tensors: list[Any], path: Path):
        import threading

        import torch

        t0 = time.perf_counter()
        total = sum(t.numel() * t.element_size() for t in tensors)
        self.buffer = torch.empty(total, dtype=torch.uint8)
        offset = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            self.buffer[offset : offset + n].copy_(t.detach().reshape(-1).view(torch.uint8))
            offset += n
        self.staging_s = time.perf_counter() - t0
        self.path = path
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        _, self.write_s = raw_write([self.buffer], self.path)

    def wait(self) -> None:
        self.thread.join()


def _neighbour_loop(conn: Any, priority: str, buffer_bytes: int) -> None:
    """The neighbour process: on each request, copy memory until it used that many CPU
    seconds, then report the CPU seconds it used; None ends it."""
    import numpy as np

    from toolkit.checkpoint.priority import lower_this_thread

    lower_this_thread(priority)
    src = np.ones(buffer_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    while (seconds := conn.recv()) is not None:
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            dst[:] = src
        conn.send(time.process_time() - t0)


class Neighbour:
    """Baseline for what any CPU work beside training costs it on this machine: another
    process, at the checkpoint writer's priority, copying memory (buffers far larger than
    the CPU caches, as a save streams its state) for a given number of CPU seconds. It
    shares no GIL and no tensors with training, so on a machine whose cores are independent
    it costs training nothing; where the "spare" core shares the physical core or memory
    bandwidth with training's (SMT siblings, a busy VM host), it shows how much."""

    def __init__(self, priority: str, buffer_bytes: int = 512 << 20):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_neighbour_loop, args=(child, priority, buffer_bytes), daemon=True
        )
        self.process.start()
        self.conn.send(0.0)  # wait until it is up and its buffers are allocated
        self.conn.recv()

    def start(self, cpu_s: float) -> None:
        self.conn.send(cpu_s)

    def wait(self) -> float:
        """The CPU seconds the neighbour used for the last request."""
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=10)


def discarding_storage() -> Any:
    """For the `null` stall variant: the toolkit's save path end to end (state dict, staging,
    DCP planning and collectives, commit) with the shard bytes thrown away instead of
    written, so that the save's cost without the write can be compared with the whole."""
    import contextlib
    import io

    from toolkit.checkpoint.storage import GuardedFileSystem, LocalStorage

    class _Discard(io.RawIOBase):
        def __init__(self) -> None:
            self.pos = 0

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            self.pos += memoryview(data).nbytes
            return memoryview(data).nbytes

        def tell(self) -> int:
            return self.pos

    class _DiscardingFileSystem(GuardedFileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Any:
            if "w" in mode and str(path).endswith(".distcp"):
                yield _Discard()
            else:
                with super().create_stream(path, mode) as stream:
                    yield stream

    class _DiscardingStorage(LocalStorage):
        def dcp_writer(self, path: Path) -> Any:
            writer = super().dcp_writer(path)
            writer.fs = _DiscardingFileSystem()
            return writer

    return _DiscardingStorage()


def plan_every_save(ckpt: Any) -> None:
    """`ckpt` plans every save afresh, as DCP does by default (toolkit.checkpoint.planning)."""
    if ckpt._plans is not None:
        ckpt._plans.clear()
        ckpt._plans = None


def pickle_every_tensor(ckpt: Any) -> None:
    """`ckpt` writes every tensor with torch.save, as DCP does (toolkit.checkpoint.serialization)."""
    ckpt.storage.cache_headers = False


def use_dcp_defaults(ckpt: Any) -> None:
    """Baseline for the `dcp` variants: `ckpt` stages with DCP's own copies, which hold the
    GIL (toolkit.checkpoint.staging), plans every save afresh and pickles every tensor;
    everything else unchanged."""
    from toolkit.checkpoint.staging import build_stager

    if ckpt._stager is not None:
        ckpt._stager.close()
        ckpt._stager = build_stager(ckpt.device, ckpt.cfg.overlap_staging, gil_free=False)
    plan_every_save(ckpt)
    pickle_every_tensor(ckpt)


def cpu_seconds() -> dict[str, float]:
    """Machine-wide CPU time by kind since boot (/proc/stat), and this process's own."""
    fields = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        values = f.readline().split()[1 : 1 + len(fields)]
    out = {k: int(v) / hz for k, v in zip(fields, values, strict=True)}
    own = os.times()
    out["this_process"] = own.user + own.system
    return out


# -- stall: one process per rank ---------------------------------------------------------
def _local_tensors(state: dict[str, Any]) -> list[Any]:
    import torch

    out = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)
        elif isinstance(v, torch.Tensor):
            out.append(v.to_local() if hasattr(v, "to_local") else v)

    walk(state)
    return out


def train_one_step(trainer: Any) -> None:
    """One training step outside `fit()`, as the benchmark windows time it."""
    _, micro = next(trainer.loader)
    trainer.train_step(micro)
    trainer.state.step += 1


class _WaitStaged(Hook):
    def __init__(self, ckpts: list[Any]):
        self.ckpts = ckpts

    def before_optimizer_step(self, trainer: Any) -> None:
        for c in self.ckpts:
            c.wait_staged()


def start_rank(rank: int, world: int, port: int, job: Any, out_dir: str) -> tuple[Any, Any]:
    """This process as rank `rank` of `world` on this machine: process group, trainer, device."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    from toolkit.distributed.env import discover
    from toolkit.distributed.init import init_distributed
    from toolkit.tasks.train import build_trainer

    env = discover()
    device = init_distributed(env, 1800)
    return build_trainer(job, env, Path(out_dir) / "run", device), device


def bench_job(model: str, seq_len: int = 64, global_batch: int = 4) -> tuple[list[str], Any]:
    """The benchmarks' job: `model` on synthetic data, checkpointing on; (overrides, job)."""
    from toolkit.config.compose import compose_raw, to_job

    overrides = [
        f"model={model}",
        "data=synthetic",
        f"data.seq_len={seq_len}",
        f"trainer.global_batch_size={global_batch}",
        "data.prefetch=0",
        "checkpoint.enabled=true",
        "trainer.progress=false",
    ]
    return overrides, to_job(compose_raw(overrides))


def stall_worker(
    rank: int,
    world: int,
    port: int,
    job: Any,
    out_dir: str,
    trials: int,
    steps: int,
    variants: list[str],
    neighbour_cpu_s: float = 0.0,
    baselines_every: int = 1,
) -> None:
    trainer, device = start_rank(rank, world, port, job, out_dir)
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
    pg = next(iter(ckpts.values())).pg

    def step() -> None:
        train_one_step(trainer)

    for _ in range(2):  # warm-up: allocation, optimizer state
        step()
    neighbour = Neighbour(job.checkpoint.writer_priority) if neighbour_cpu_s > 0 else None
    modes = ["none", "raw-bg", *ckpts, "sync", *(["neighbour"] if neighbour else [])]
    neighbour_used: list[float] = []
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    # Each measured window sits between two windows without a checkpoint; its reference is
    # their mean (window time and CPU), so that a drift of the machine's speed cancels.
    measured = modes[1:]
    reference: dict[str, list[dict[str, Any]]] = {m: [] for m in measured}
    raw_bg: list[dict[str, float]] = []
    saves: dict[str, list[dict[str, Any]]] = {m: [] for m in ckpts}
    sync_s: list[float] = []
    baselines = ("raw-bg", "sync")  # measured in every `baselines_every`-th trial only
    for trial in range(trials):
        now = [m for m in measured if m not in baselines or trial % baselines_every == 0]
        rotated = now[trial % len(now) :] + now[: trial % len(now)]
        order = ["none", *(m for mode in rotated for m in (mode, "none"))]
        for position, mode in enumerate(order):
            dist.barrier()
            cpu0 = cpu_seconds()
            t0 = time.perf_counter()
            background = None
            for i in range(steps):
                step()
                if i == 0 and mode == "raw-bg":
                    m, o = get_state_dict(trainer.model, trainer.optimizer)
                    background = BackgroundRawWrite(
                        _local_tensors({"model": m, "optim": o}), root / "raw-bg" / f"{rank}.bin"
                    )
                elif i == 0 and mode in ckpts:
                    ckpts[mode].save(
                        trainer.state.step,
                        trainer.model,
                        trainer.optimizer,
                        {"step": trainer.state.step},
                    )
                elif i == 0 and mode == "neighbour":
                    neighbour.start(neighbour_cpu_s)
                elif i == 0 and mode == "sync":
                    m, o = get_state_dict(trainer.model, trainer.optimizer)
                    sync_s.append(
                        sync_dcp_save({"model": m, "optim": o}, root / f"sync-{trial}", pg)
                    )
            steps_end = time.time()
            if mode in ckpts:  # a save still running after the last step counts as lost
                finished = ckpts[mode].wait()
            if mode == "neighbour":  # like a save, work still running counts as lost
                neighbour_used.append(neighbour.wait())
            if background is not None:
                background.wait()
                raw_bg.append({"staging_s": background.staging_s, "write_s": background.write_s})
            dist.barrier()
            times[mode].append(time.perf_counter() - t0)
            cpu1 = cpu_seconds()
            cpu[mode].append({k: cpu1[k] - cpu0[k] for k in cpu0})
            if mode == "none" and position > 0:  # closes the bracket around the window before
                before, after = -2, -1
                reference[order[position - 1]].append(
                    {
                        "window_s": (times["none"][before] + times["none"][after]) / 2,
                        "cpu_s": {
                            k: (cpu["none"][before][k] + cpu["none"][after][k]) / 2 for k in cpu0
                        },
                    }
                )
            if rank == 0:
                print(f"trial {trial} {mode}: {times[mode][-1]:.2f} s", file=sys.stderr, flush=True)
            if mode in ckpts:
                for r in finished:
                    saves[mode].append(
                        {
                            "stall_s": r.stall_s,
                            "staging_s": r.staging_s,
                            "write_s": r.write_s,
                            "checksum_s": r.checksum_s,
                            "commit_s": r.commit_s,
                            "size_bytes": r.size_bytes,
                            "finished_before_last_step_end": r.end <= steps_end,
                            "tail_wait_s": max(0.0, r.end - steps_end),
                            "writer_priority": r.writer.thread_priority,
                            "direct_io": r.writer.direct_io,
                            "error": r.error,
                        }
                    )
            dist.barrier()
            if rank == 0:
                for p in [*root.glob("ckpt-*/step-*"), *root.glob("sync-*"), root / "raw-bg"]:
                    shutil.rmtree(p, ignore_errors=True)
            dist.barrier()
    m, o = get_state_dict(trainer.model, trainer.optimizer)
    local = _local_tensors({"model": m, "optim": o})
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
            "window_s": times,
            "reference": reference,
            "async_saves": saves,
            "sync_save_s": sync_s,
            "raw_background": raw_bg,
            "neighbour_cpu_s": neighbour_used,  # rank 0's neighbour
            "cpu_s": cpu,
            "checkpoint_bytes": max(s["size_bytes"] for v in saves.values() for s in v),
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


def run_stall(args: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from toolkit.distributed.env import free_port

    overrides, job = bench_job(args.model, args.seq_len, args.global_batch)
    out_dir = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        mp.spawn(
            stall_worker,
            args=(
                args.ranks,
                free_port(),
                job,
                str(out_dir),
                args.trials,
                args.steps,
                args.variants.split(","),
                args.neighbour_cpu_s,
                args.baselines_every,
            ),
            nprocs=args.ranks,
        )
        raw = json.loads((out_dir / RESULT).read_text())
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return {"overrides": overrides, "raw": raw, "summary": summarize_stall(raw)}


# -- gil: how long a save keeps the training thread from running Python --------------------
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


def gil_worker(rank: int, port: int, job: Any, out_dir: str, reps: int) -> None:
    """One rank; per repetition and variant: an async save, then the training thread's
    stand-in (`kept_out_while`) until it committed. Variants: the toolkit's save; the same
    pickling every tensor (`pickle_every_tensor`); planning every save afresh
    (`plan_every_save`); DCP's defaults (`use_dcp_defaults`, the baseline); the toolkit's with
    the shard bytes discarded."""
    trainer, device = start_rank(rank, 1, port, job, out_dir)
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


def run_gil(args: argparse.Namespace) -> dict[str, Any]:
    """How long one async save keeps the training thread from running Python (the time
    `save()` takes to return, plus how late a thread that sleeps 1 ms at a time wakes while
    the save is staged and written), with the toolkit's save against DCP's defaults. Medians."""
    import torch.multiprocessing as mp

    from toolkit.distributed.env import free_port

    overrides, job = bench_job(args.model)
    out_dir = Path(tempfile.mkdtemp(prefix="bench-ckpt-gil-", dir=args.dir))
    try:
        mp.spawn(gil_worker, args=(free_port(), job, str(out_dir), args.reps), nprocs=1)
        rows = json.loads((out_dir / RESULT).read_text())
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    summary = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for name, runs in rows.items()
    }
    return {"overrides": overrides, "raw": rows, "summary": summary}


# -- CPU cost per GB of the pieces of a save -----------------------------------------------
def run_cpu_cost(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Wall and CPU seconds per piece of a save, for `--gb` of fp32 tensors in one process:
    DCP's writer with and without torch.save's zip CRC-32, the toolkit's writer (no CRC,
    checksums while writing) through the page cache and with O_DIRECT, a plain write of the
    same bytes (the baseline), and read-back checksums with sha256 (format 1) and xxh3-128
    (format 2). CPU is this thread's and the whole machine's busy time (which also catches
    the kernel's writeback threads; run it on an idle machine). Repetitions interleaved,
    medians reported."""
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.utils.serialization
    from torch.distributed.checkpoint import FileSystemWriter

    from toolkit.checkpoint.manifest import checksum_file
    from toolkit.checkpoint.storage import LocalStorage

    per = 1_700_000  # ~6.8 MB per tensor, like the blocks of gpt_125m and their AdamW state
    count = max(1, int(args.gb * 1e9 / (per * 4)))
    tensors = {f"t{i}": torch.randn(per) for i in range(count)}
    nbytes = count * per * 4
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-cpu-", dir=args.dir))
    config = torch.utils.serialization.config.save

    def dcp_write(crc: bool) -> None:
        config.compute_crc32 = crc
        try:
            writer = FileSystemWriter(root / "dcp", single_file_per_rank=True, sync_files=True)
            dcp.save(tensors, storage_writer=writer, no_dist=True)
        finally:
            config.compute_crc32 = True

    def shard_write(direct: bool) -> None:
        dcp.save(
            tensors, storage_writer=LocalStorage(direct).dcp_writer(root / "dcp"), no_dist=True
        )

    def plain_write() -> None:  # baseline: the same bytes, plain writes + fsync
        raw_write(list(tensors.values()), root / "plain.bin")

    pieces = {
        "DCP write, zip CRC-32 on (torch default)": lambda: dcp_write(True),
        "DCP write, zip CRC-32 off": lambda: dcp_write(False),
        "toolkit writer, page cache (direct_io=false)": lambda: shard_write(False),
        "toolkit writer, O_DIRECT (direct_io=true)": lambda: shard_write(True),
        "plain write + fsync (baseline)": plain_write,
        "read-back sha256 (manifest format 1)": lambda: checksum_file(root / "plain.bin", "sha256"),
        "read-back xxh3-128 (manifest format 2)": lambda: checksum_file(
            root / "plain.bin", "xxh3_128"
        ),
    }
    samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in pieces}
    try:
        plain_write()
        for _ in range(args.reps):
            for name, fn in pieces.items():
                shutil.rmtree(root / "dcp", ignore_errors=True)
                m0 = _busy(cpu_seconds())
                w0, c0 = time.perf_counter(), time.thread_time()
                fn()
                wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                samples[name].append((wall, cpu, _busy(cpu_seconds()) - m0))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    gb = nbytes / 1e9
    for name, s in samples.items():
        wall, cpu, machine = (statistics.median(x[i] for x in s) for i in range(3))
        rows.append(
            {
                "piece": name,
                "GB": gb,
                "wall_s_per_GB": wall / gb,
                "cpu_s_per_GB": cpu / gb,
                "machine_cpu_s_per_GB": machine / gb,
            }
        )
        print(
            f"{name:45s} wall {wall / gb:.2f} s/GB  CPU {cpu / gb:.2f} s/GB  "
            f"machine CPU {machine / gb:.2f} s/GB",
            flush=True,
        )
    return rows


def _busy(cpu: dict[str, float]) -> float:
    """Machine-wide busy CPU seconds (idle, iowait and steal excluded)."""
    return sum(cpu[k] for k in ("user", "nice", "system", "irq", "softirq"))


# -- time to the first resumed step --------------------------------------------------------
def _launch(run_dir: Path, overrides: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [
        sys.executable,
        "-m",
        "toolkit.launch",
        *overrides,
        f"hydra.run.dir={run_dir}",
        "launch.follow=false",
    ]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return t0, done


def _first_step_wall(run_dir: Path, step: int) -> float:
    for line in (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["step"] == step:
            return rec["wall_time"] - rec["step_time_s"]  # when the step began
    raise LookupError(step)


def run_resume(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for model in args.models.split(","):
        base = [
            f"model={model}",
            "data=synthetic",
            f"data.seq_len={args.seq_len}",
            "trainer.global_batch_size=2",
            "checkpoint.enabled=true",
            "trainer.eval_batches=0",
            "trainer.progress=false",
        ]
        for rep in range(args.reps):
            tmp = Path(tempfile.mkdtemp(prefix="bench-resume-", dir=args.dir))
            try:
                t_fresh, _ = _launch(tmp / "run", [*base, "trainer.steps=1"])
                fresh = _first_step_wall(tmp / "run", 1) - t_fresh
                t_res, _ = _launch(tmp / "run", [*base, "trainer.steps=2"])
                resumed = _first_step_wall(tmp / "run", 2) - t_res
                events = [
                    json.loads(x)
                    for x in (tmp / "run" / "metrics" / "events-rank0.jsonl")
                    .read_text()
                    .splitlines()
                ]
                restart = next(e for e in events if e["name"] == "restart")
                size = json.loads(
                    (Path(restart["attrs"]["checkpoint"]) / "manifest.json").read_text()
                )
                total = sum(f["size_bytes"] for f in size["files"].values())
                rows.append(
                    {
                        "model": model,
                        "rep": rep,
                        "checkpoint_GB": total / 1e9,
                        "fresh_start_to_first_step_s": fresh,
                        "resume_start_to_first_step_s": resumed,
                        "load_s": restart["attrs"]["load_s"],
                        "verify_s": restart["attrs"]["verify_s"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.checkpoint")
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("stall")
    s.add_argument("--model", default="gpt_125m")
    s.add_argument("--ranks", type=int, default=2)
    s.add_argument("--trials", type=int, default=5)
    s.add_argument("--steps", type=int, default=6)
    s.add_argument("--seq-len", type=int, default=64)
    s.add_argument("--global-batch", type=int, default=4)
    s.add_argument(
        "--variants",
        default="idle:overlap:direct,idle:overlap:buffered",
        help="async modes, each <checkpoint.writer_priority>:<overlap|copy>[:<direct|buffered|null>"
        "[:dcp|pickle]] (overlap_staging, direct_io; default direct; null: DCP's whole save path,"
        " but the shard bytes are discarded instead of written; dcp: DCP's defaults, its own"
        " stager (whose copies hold the GIL), a fresh plan every save and every tensor pickled,"
        " instead of the toolkit's; pickle: the toolkit's save with every tensor pickled)",
    )
    s.add_argument(
        "--neighbour-cpu-s",
        type=float,
        default=0.0,
        help="also a window in which another process copies memory for this many CPU seconds"
        " (per rank, at the writer's priority; `Neighbour`): what that much CPU work beside"
        " training costs it on this machine. Set it to an async save's CPU seconds (the"
        " summary's save_cpu_s); 0: off",
    )
    s.add_argument(
        "--baselines-every",
        type=int,
        default=1,
        help="measure the blocking save and the plain background write in every N-th trial"
        " only (more trials of the async variants in the same time; the blocking save's lost"
        " time varies far less than theirs)",
    )
    c = sub.add_parser("cpu")
    c.add_argument("--gb", type=float, default=1.0)
    c.add_argument("--reps", type=int, default=3)
    g = sub.add_parser("gil")
    g.add_argument("--model", default="gpt_125m")
    g.add_argument("--reps", type=int, default=3)
    r = sub.add_parser("resume")
    r.add_argument("--models", default="gpt_tiny,gpt_small,gpt_125m")
    r.add_argument("--reps", type=int, default=2)
    r.add_argument("--seq-len", type=int, default=64)
    for p in (s, r, c, g):
        p.add_argument(
            "--dir", default=None, help="where checkpoints are written (default: $TMPDIR)"
        )
        p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if getattr(args, "baselines_every", 1) < 1:
        parser.error(f"--baselines-every {args.baselines_every}: must be >= 1 (1: every trial)")
    runs = {"stall": run_stall, "resume": run_resume, "cpu": run_cpu_cost, "gil": run_gil}
    result: Any = runs[args.what](args)
    text = json.dumps(result, indent=1)
    print(text if args.what in ("stall", "gil") else "")
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
