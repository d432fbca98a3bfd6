"""What the checkpoint benchmarks share: the job they train, the start of a rank's trainer
(its environment set by `toolkit.bench.ranks`), one training step outside `fit()`, the plain
write of a rank's bytes (the baseline for every save), the toolkit's save with parts of DCP's
defaults put back, and the machine's CPU time."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

RESULT = "bench-checkpoint.json"


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


def local_tensors(state: dict[str, Any]) -> list[Any]:
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


def start_trainer(job: Any, out_dir: str, timeout_s: float = 1800) -> tuple[Any, Any]:
    """This process's rank (environment from `toolkit.bench.ranks.run_ranks`): process
    group, trainer, device."""
    from toolkit.distributed.env import discover
    from toolkit.distributed.init import init_distributed
    from toolkit.tasks.train import build_trainer

    env = discover()
    device = init_distributed(env, timeout_s)
    trainer = build_trainer(job, env, Path(out_dir) / "run", device)
    # The benchmarks step outside fit(), which starts the job's hooks (its checkpointing):
    # they save with checkpointers of their own and leave the job's out.
    trainer.hooks = []
    return trainer, device


def bench_job(
    model: str, seq_len: int = 64, global_batch: int = 4, checkpoint: bool = True
) -> tuple[list[str], Any]:
    """The benchmarks' job: `model` on synthetic data, checkpointing on unless `checkpoint`
    is false; (overrides, job)."""
    from toolkit.config.compose import compose_raw, to_job

    overrides = [
        f"model={model}",
        "data=synthetic",
        f"data.seq_len={seq_len}",
        f"trainer.global_batch_size={global_batch}",
        "data.num_workers=0",
        *(["checkpoint.enabled=true"] if checkpoint else []),
        "trainer.progress=false",
    ]
    return overrides, to_job(compose_raw(overrides))
