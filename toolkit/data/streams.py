"""An IterableDataset split across ranks and DataLoader workers (docs/data.md, "Your own
IterableDataset").

Reader k of n (k = rank * workers + worker, n = world * workers; one worker per rank when
data.num_workers=0) reads its shard of the stream, by the first convention the dataset
follows:

- `shard(index, count)`: a method the toolkit calls in each reader before iterating; the
  dataset then yields only its part (e.g. every count-th file from the index-th), reading
  nothing of the others' parts;
- `shards_itself = True`: the dataset splits itself (torch.distributed and
  torch.utils.data.get_worker_info in its own `__iter__`); the toolkit leaves it alone and
  checks at the first step that the ranks' batches differ (StreamLoader);
- otherwise the toolkit keeps every n-th item of the stream, starting at item k: each
  reader still iterates the whole stream, but collates and hands over only its share.

`set_epoch(epoch)`, where the dataset has it, is called before each epoch (a finite stream
is read again from its start when it ends).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info


def shard_mode(dataset: Any) -> str:
    """shard | itself | every_nth: how the dataset's stream is split (the module docstring)."""
    if callable(getattr(dataset, "shard", None)):
        return "shard"
    if getattr(dataset, "shards_itself", False) is True:
        return "itself"
    return "every_nth"


def is_stateful(dataset: Any) -> bool:
    """torchdata's Stateful convention: both state_dict and load_state_dict."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


class ShardedStream(IterableDataset):
    """This rank's readers' view of the user's stream: reader k of n keeps its shard."""

    def __init__(self, dataset: IterableDataset, rank: int, world_size: int):
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.mode = shard_mode(dataset)
        self.epoch = 0
        self.started = False  # this reader has yielded an item of the current epoch

    def reader(self) -> tuple[int, int]:
        """(k, n): this reader's index among all ranks' readers, and their number."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def set_epoch(self, epoch: int) -> None:
        """Before an epoch's readers start (so a reader's restored state comes after it)."""
        self.epoch = epoch
        self.started = False
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        index, count = self.reader()
        if self.mode == "shard":
            self.dataset.shard(index, count)
        items: Iterator[Any] = iter(self.dataset)
        if self.mode == "every_nth" and count > 1:
            # A resumed reader's dataset is just past the item it yielded last.
            items = itertools.islice(items, count - 1 if self.started else index, None, count)
        for item in items:
            self.started = True
            yield item


class StatefulShardedStream(ShardedStream):
    """A ShardedStream over a dataset with state_dict/load_state_dict: each reader's state
    is its dataset's, plus where it is in its shard (torchdata's StatefulDataLoader saves
    and restores it per worker)."""

    def state_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset.state_dict(), "started": self.started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state["dataset"])
        self.started = bool(state["started"])


def sharded(dataset: IterableDataset, rank: int, world_size: int) -> ShardedStream:
    cls = StatefulShardedStream if is_stateful(dataset) else ShardedStream
    return cls(dataset, rank, world_size)
