"""Training data: memory-mapped sources and a deterministic, resumable batch schedule.

The global batch of step `s` is a function of (seed, s) alone: `global_batch` window starts
drawn from a generator seeded with (seed, split, s). Rank r takes, for micro-step m, the
slice [(m * world + r) * micro, +micro). So the data a step sees does not depend on the
world size (resharding keeps the data position exact), and resuming at step s needs only s.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from toolkit.config.data import DataConfig
from toolkit.config.shape import BatchShape

# Re-exported: file preparation lives in a torch-free module so the launcher stays light.
from toolkit.train.data_files import builtin_corpus, prepare  # noqa: F401

SPLITS = {"train": 0, "val": 1}


class Source(Protocol):
    """Windows of a 1-D (tokens) or 2-D ([time, series]) array."""

    def __len__(self) -> int: ...

    def window(self, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class ArraySource:
    """Inputs are array[s : s+L], targets array[s+1 : s+L+1]. Tokens become int64, series float32."""

    array: np.ndarray

    def __len__(self) -> int:
        return len(self.array)

    def window(self, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
        chunk = np.asarray(self.array[idx])
        if chunk.dtype == np.uint8:
            chunk = chunk.astype(np.int64)
        t = torch.from_numpy(chunk)
        return t[:, :-1], t[:, 1:]


@dataclass
class SyntheticTokens:
    """Uniform random tokens; each window is generated from its own start (deterministic, no
    I/O, and the same window whatever micro-batch it lands in, so any world size sees the
    same global batch)."""

    vocab_size: int
    length: int = 1 << 30

    def __len__(self) -> int:
        return self.length

    def window(self, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [
            np.random.default_rng(int(s)).integers(0, self.vocab_size, seq_len + 1) for s in starts
        ]
        t = torch.from_numpy(np.stack(rows))
        return t[:, :-1], t[:, 1:]


def open_sources(cfg: DataConfig, vocab_size: int) -> dict[str, Source]:
    """Memory-map the data and split it: the last val_fraction is the validation set.
    (data=returns has its own samples and loader: toolkit.data.loader.)"""
    if cfg.kind == "returns":
        raise ValueError("data=returns: use toolkit.data.loader.build_loaders")
    if cfg.kind == "synthetic":
        return {"train": SyntheticTokens(vocab_size), "val": SyntheticTokens(vocab_size, 1 << 20)}
    path = prepare(cfg)
    assert path is not None
    if not path.exists():
        raise FileNotFoundError(f"data.path={path}: no such file")
    array = np.memmap(path, dtype=np.uint8, mode="r")
    split = int(len(array) * (1 - cfg.val_fraction))
    if split <= cfg.seq_len + 1 or len(array) - split <= cfg.seq_len + 1:
        raise ValueError(
            f"data.path={path}: {len(array)} items is too short for seq_len={cfg.seq_len}"
        )
    return {"train": ArraySource(array[:split]), "val": ArraySource(array[split:])}


@dataclass(frozen=True)
class BatchPlan(BatchShape):
    """The text and synthetic-token loaders' plan: windows drawn per (seed, split, step)."""

    def starts(self, source_len: int, split: str, step: int) -> np.ndarray:
        """Window starts of the whole global batch of `step`."""
        rng = np.random.default_rng([self.seed, SPLITS[split], step])
        return rng.integers(0, source_len - self.seq_len - 1, size=self.global_batch_size)

    def micro_batches(
        self, source: Source, split: str, step: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        starts = self.starts(len(source), split, step)
        out = []
        for m in range(self.grad_accum):
            lo = (m * self.world_size + self.rank) * self.micro_batch_size
            out.append(source.window(starts[lo : lo + self.micro_batch_size], self.seq_len))
        return out


class Loader:
    """Yields (step, micro-batches) from `start_step` on. A daemon thread prepares `prefetch`
    steps ahead; threads never receive signals, so preemption handling stays in the main thread."""

    def __init__(self, source: Source, plan: BatchPlan, prefetch: int = 2, split: str = "train"):
        self.source = source
        self.plan = plan
        self.prefetch = prefetch
        self.split = split
        self.next_step = 0
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def state_dict(self) -> dict[str, int]:
        return {"next_step": self.next_step, "seed": self.plan.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.close()
        self.next_step = int(state["next_step"])

    def batch(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Step `step`'s micro-batches, computed here (evaluation)."""
        return self.plan.micro_batches(self.source, self.split, step)

    def _produce(self, first: int) -> None:
        step = first
        while not self._stop.is_set():
            try:
                item = (step, self.plan.micro_batches(self.source, self.split, step))
            except BaseException as exc:  # noqa: BLE001 - hand the error to the training thread
                item = (step, exc)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            step += 1

    def __iter__(self) -> Iterator[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]:
        return self

    def __next__(self) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        if self.prefetch <= 0:
            step = self.next_step
            self.next_step += 1
            return step, self.plan.micro_batches(self.source, self.split, step)
        if self._thread is None:
            self._stop.clear()
            self._queue = queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(
                target=self._produce, args=(self.next_step,), name="data-prefetch", daemon=True
            )
            self._thread.start()
        step, batches = self._queue.get()
        if isinstance(batches, BaseException):
            raise batches
        self.next_step = step + 1
        return step, batches

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._queue = None
