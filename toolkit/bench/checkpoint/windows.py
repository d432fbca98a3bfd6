"""The stall benchmark's trial windows: the same ranks run N steps several ways, each window
timed (wall and CPU seconds) between two windows of N steps without a checkpoint.

In each trial the measured modes run in rotating order, each followed by a window without
a checkpoint: an async save of each variant (`Checkpointer.save`, the training hook's code
path) after the first step; the baselines (toolkit.bench.checkpoint.baselines) after the
first step too: `raw-bg` (BackgroundRawWrite), `sync` (sync_dcp_save) and, when a Neighbour
is given, `neighbour`. An async window ends when its save has committed (work still running
after the last step counts as lost time). A measured window's reference is the mean of the
windows without a checkpoint right before and after it, so that a drift of the machine's
speed cancels. With `baselines_every` K, `raw-bg` and `sync` run in every K-th trial only.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.bench.checkpoint.baselines import BackgroundRawWrite, Neighbour, sync_dcp_save
from toolkit.bench.checkpoint.shared import cpu_seconds, local_tensors, train_one_step

BASELINES = ("raw-bg", "sync")  # measured in every `baselines_every`-th trial only


@dataclass
class Windows:
    """What the trials measured, by mode ("none", "raw-bg", each async variant, "sync",
    "neighbour"): window seconds, CPU seconds by kind, and each measured window's reference."""

    times: dict[str, list[float]]
    cpu: dict[str, list[dict[str, float]]]
    reference: dict[str, list[dict[str, Any]]]
    saves: dict[str, list[dict[str, Any]]]  # each async variant's saves, as save_record has them
    raw_bg: list[dict[str, float]] = field(default_factory=list)
    sync_s: list[float] = field(default_factory=list)
    neighbour_used: list[float] = field(default_factory=list)  # the neighbour's CPU seconds


def save_record(r: Any, steps_end: float) -> dict[str, Any]:
    """One async save (a SaveResult) as the result file keeps it; `steps_end`: time.time()
    when the window's last step ended."""
    return {
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


def run_trials(
    trainer: Any,
    ckpts: dict[str, Any],
    root: Path,
    rank: int,
    trials: int,
    steps: int,
    neighbour: Neighbour | None = None,
    neighbour_cpu_s: float = 0.0,
    baselines_every: int = 1,
) -> Windows:
    """Run `trials` trials of windows of `steps` steps on every rank (collectively: each
    window starts and ends with a barrier). `ckpts`: the async variants' Checkpointers by
    mode name; the blocking baseline saves over the first one's process group."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    pg = next(iter(ckpts.values())).pg
    modes = ["none", "raw-bg", *ckpts, "sync", *(["neighbour"] if neighbour else [])]
    measured = modes[1:]
    out = Windows(
        times={m: [] for m in modes},
        cpu={m: [] for m in modes},
        reference={m: [] for m in measured},
        saves={m: [] for m in ckpts},
    )
    times, cpu = out.times, out.cpu
    for trial in range(trials):
        now = [m for m in measured if m not in BASELINES or trial % baselines_every == 0]
        rotated = now[trial % len(now) :] + now[: trial % len(now)]
        order = ["none", *(m for mode in rotated for m in (mode, "none"))]
        for position, mode in enumerate(order):
            dist.barrier()
            cpu0 = cpu_seconds()
            t0 = time.perf_counter()
            background = None
            for i in range(steps):
                train_one_step(trainer)
                if i == 0 and mode == "raw-bg":
                    m, o = get_state_dict(trainer.model, trainer.optimizer)
                    background = BackgroundRawWrite(
                        local_tensors({"model": m, "optim": o}), root / "raw-bg" / f"{rank}.bin"
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
                    out.sync_s.append(
                        sync_dcp_save({"model": m, "optim": o}, root / f"sync-{trial}", pg)
                    )
            steps_end = time.time()
            if mode in ckpts:  # a save still running after the last step counts as lost
                finished = ckpts[mode].wait()
            if mode == "neighbour":  # like a save, work still running counts as lost
                out.neighbour_used.append(neighbour.wait())
            if background is not None:
                background.wait()
                out.raw_bg.append(
                    {"staging_s": background.staging_s, "write_s": background.write_s}
                )
            dist.barrier()
            times[mode].append(time.perf_counter() - t0)
            cpu1 = cpu_seconds()
            cpu[mode].append({k: cpu1[k] - cpu0[k] for k in cpu0})
            if mode == "none" and position > 0:  # closes the bracket around the window before
                before, after = -2, -1
                out.reference[order[position - 1]].append(
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
                out.saves[mode].extend(save_record(r, steps_end) for r in finished)
            dist.barrier()
            if rank == 0:
                for p in [*root.glob("ckpt-*/step-*"), *root.glob("sync-*"), root / "raw-bg"]:
                    shutil.rmtree(p, ignore_errors=True)
            dist.barrier()
    return out
