"""Token data (data=text, data=synthetic) on the shared Loader path (toolkit.data.loader):
memory-mapped or generated windows and a deterministic, resumable batch schedule.

The global batch of step `s` is a function of (seed, s) alone: `global_batch` window starts
drawn from a generator seeded with (seed, split, s). Rank r takes, for micro-step m, the
slice [(m * world + r) * micro, +micro). So the data a step sees does not depend on the
world size (resharding keeps the data position exact) nor on the number of DataLoader
workers, and resuming at step s needs only s.

The corpus is memory-mapped lazily, once per process that reads it (`MappedTokens`): a
DataLoader worker pickles the source as (path, start, stop) and maps the file itself on its
first window, so no start method copies the corpus, and every worker and rank shares the
same pages of the page cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

from toolkit.config.data import DataConfig
from toolkit.config.shape import BatchShape
from toolkit.data.files import prepare
from toolkit.data.loader import StepLoader

SPLITS = {"train": 0, "val": 1}

Window = tuple[torch.Tensor, torch.Tensor]


class Source(Protocol):
    """Windows of a 1-D array of tokens."""

    def __len__(self) -> int: ...

    def window(self, starts: np.ndarray, seq_len: int) -> Window: ...


def byte_windows(array: np.ndarray, starts: np.ndarray, seq_len: int) -> Window:
    """Inputs are array[s : s+L], targets array[s+1 : s+L+1]; bytes become int64."""
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    chunk = np.asarray(array[idx])
    if chunk.dtype == np.uint8:
        chunk = chunk.astype(np.int64)
    t = torch.from_numpy(chunk)
    return t[:, :-1], t[:, 1:]


class MappedTokens:
    """Bytes [start, stop) of a file, memory-mapped on first use in each process (pickled
    without the mapping, so a DataLoader worker maps the file itself)."""

    def __init__(self, path: Path, start: int, stop: int):
        self.path = path
        self.start = start
        self.stop = stop
        self._array: np.memmap | None = None

    def __len__(self) -> int:
        return self.stop - self.start

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}

    @property
    def array(self) -> np.memmap:
        if self._array is None:
            self._array = np.memmap(
                self.path, dtype=np.uint8, mode="r", offset=self.start, shape=(len(self),)
            )
        return self._array

    def window(self, starts: np.ndarray, seq_len: int) -> Window:
        return byte_windows(self.array, starts, seq_len)


@dataclass
class SyntheticTokens:
    """Uniform random tokens; each window is generated from its own start (deterministic, no
    I/O, and the same window whatever micro-batch it lands in, so any world size sees the
    same global batch)."""

    vocab_size: int
    length: int = 1 << 30

    def __len__(self) -> int:
        return self.length

    def window(self, starts: np.ndarray, seq_len: int) -> Window:
        rows = [
            np.random.default_rng(int(s)).integers(0, self.vocab_size, seq_len + 1) for s in starts
        ]
        t = torch.from_numpy(np.stack(rows))
        return t[:, :-1], t[:, 1:]


def open_sources(cfg: DataConfig, vocab_size: int) -> dict[str, Source]:
    """The training and validation sources: the last val_fraction of the file validates.
    (data=returns has its own samples and loader: toolkit.data.loader.)"""
    if cfg.kind == "returns":
        raise ValueError("data=returns: use toolkit.data.loader.build_loaders")
    if cfg.kind == "synthetic":
        return {"train": SyntheticTokens(vocab_size), "val": SyntheticTokens(vocab_size, 1 << 20)}
    path = prepare(cfg)
    assert path is not None  # data=text always has a file (the built-in corpus at least)
    if not path.exists():
        raise FileNotFoundError(f"data.path={path}: no such file")
    size = path.stat().st_size
    split = int(size * (1 - cfg.val_fraction))
    if split <= cfg.seq_len + 1 or size - split <= cfg.seq_len + 1:
        raise ValueError(f"data.path={path}: {size} items is too short for seq_len={cfg.seq_len}")
    return {"train": MappedTokens(path, 0, split), "val": MappedTokens(path, split, size)}


@dataclass(frozen=True)
class BatchPlan(BatchShape):
    """The token loaders' plan: windows drawn per (seed, split, step)."""

    def starts(self, source_len: int, split: str, step: int) -> np.ndarray:
        """Window starts of the whole global batch of `step`."""
        rng = np.random.default_rng([self.seed, SPLITS[split], step])
        return rng.integers(0, source_len - self.seq_len - 1, size=self.global_batch_size)

    def micro_batches(self, source: Source, split: str, step: int) -> list[Window]:
        starts = self.starts(len(source), split, step)
        out = []
        for m in range(self.grad_accum):
            lo = (m * self.world_size + self.rank) * self.micro_batch_size
            out.append(source.window(starts[lo : lo + self.micro_batch_size], self.seq_len))
        return out


class TokenSteps(Dataset):
    """Item s: this rank's micro-batches of step s."""

    def __init__(self, source: Source, plan: BatchPlan, split: str):
        self.source = source
        self.plan = plan
        self.split = split

    def __getitem__(self, step: int) -> list[Window]:
        return self.plan.micro_batches(self.source, self.split, step)


class TokenLoader(StepLoader):
    """A token source's steps, fetched in order by torch DataLoader workers."""

    def __init__(
        self,
        source: Source,
        plan: BatchPlan,
        split: str = "train",
        num_workers: int = 2,
        prefetch: int = 2,
        pin_memory: bool = False,
    ):
        super().__init__(plan, num_workers, prefetch, pin_memory)
        self.source = source
        self.split = split

    def steps(self) -> TokenSteps:
        return TokenSteps(self.source, self.plan, self.split)

    def epoch_len(self) -> int:
        """Windows drawn at random: an epoch is as many windows as the source holds."""
        return len(self.source) // self.plan.seq_len


def build_loaders(
    cfg: DataConfig, plan: BatchShape, vocab_size: int, pin_memory: bool
) -> tuple[TokenLoader, TokenLoader]:
    """Training loader (data.num_workers workers, data.prefetch steps ahead each) and the
    validation loader (computed in the training process when evaluating)."""
    sources = open_sources(cfg, vocab_size)
    plan = BatchPlan(**dataclasses.asdict(plan))
    train = TokenLoader(
        sources["train"], plan, "train", cfg.num_workers, max(cfg.prefetch, 1), pin_memory
    )
    val_plan = dataclasses.replace(plan, grad_accum=1)
    return train, TokenLoader(sources["val"], val_plan, "val", 0, 1, False)


__all__ = ["BatchPlan", "MappedTokens", "SyntheticTokens", "TokenLoader", "build_loaders"]
