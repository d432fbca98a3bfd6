"""Your own torch Dataset (`data._target_`, toolkit.config.data.DatasetConfig) under the
training loop's Loader contract (toolkit.data.loader.Loader: `next(loader)` -> (step,
micro-batches), state_dict / load_state_dict, batch(i), .plan, close).

A micro-batch is whatever the collate function returns (torch's default_collate unless
`data.collate_fn` names one): a tensor, a tuple/list or a dict of tensors.

Map-style Dataset: the sample stream is the endless sequence of epochs, epoch e a
permutation of the items seeded by (seed, e) (or the items in order, shuffle=false). The
global batch of step s is positions [s * g, (s + 1) * g) of that stream, and rank r takes,
for micro-step m, the slice [(m * world + r) * micro, +micro), as the built-in data does:
the same global batch for any world size, and resuming (on any world size) needs only s.

IterableDataset: split across ranks and DataLoader workers (toolkit.data.streams: the
dataset's `shard(index, count)`, or `shards_itself = True`, or every n-th item), each
rank's shard read through torchdata's StatefulDataLoader, whose state_dict (each worker's
dataset state, or the number of samples yielded) goes into the checkpoint, every rank's
(resume on the same number of ranks and workers). A dataset without
state_dict/load_state_dict is replayed by skipping the samples already seen
(StatefulDataLoader's fallback): exact only when the stream is deterministic. A finite
stream ends its epoch and is read again (`epoch` counts; set_epoch first where it has it).
"""

from __future__ import annotations

import atexit
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset, IterableDataset, Subset, default_collate

from toolkit.config.data import DatasetConfig
from toolkit.data.loader import (
    SamplePlan,
    StepLoader,
    _preemption_signals_blocked,
    worker_options,
)
from toolkit.data.samples import SampleOrder
from toolkit.data.streams import sharded
from toolkit.errors import EXIT_RESUME_REFUSED, UserError

Collate = Callable[[list[Any]], Any]

log = logging.getLogger(__name__)


def build(target: str, kwargs: dict[str, Any], what: str = "data._target_") -> Any:
    """`target(**kwargs)` by Hydra's instantiate; a failure is one line naming the target."""
    from hydra.utils import instantiate

    try:
        return instantiate({"_target_": target, **kwargs}, _convert_="all")
    except Exception as exc:  # noqa: BLE001 - the user's import or constructor: one line
        cause = exc.__cause__ or exc
        raise UserError(f"{what}={target}: cannot be built ({cause})") from exc


def collate_of(path: str | None) -> Collate:
    if path is None:
        return default_collate
    from hydra.utils import get_object

    try:
        fn = get_object(path)
    except Exception as exc:  # noqa: BLE001 - the user's import: one line
        raise UserError(f"data.collate_fn={path}: cannot be imported ({exc})") from exc
    if not callable(fn):
        raise UserError(f"data.collate_fn={path}: not callable")
    return fn


@dataclass(frozen=True)
class CollateFailure:
    """A micro-batch that could not be collated, in place of the step's batches: the one
    line crosses from a DataLoader worker as data (an exception raised there would reach
    the rank as torch's wrapper, the worker's traceback inside its message)."""

    message: str


def collated(collate: Collate, items: list[Any], names: list[str]) -> Any:
    """collate(items); when it fails, a UserError naming the item that differs from the
    others (names[k]: "item 17" of a Dataset, "sample 40" of a stream) and both shapes."""
    try:
        return collate(items)
    except Exception as exc:  # noqa: BLE001 - the user's items or collate: one line
        raise UserError(collate_failure(collate, items, names, exc)) from None


def collate_failure(collate: Collate, items: list[Any], names: list[str], exc: Exception) -> str:
    shapes = [shape_of(item) for item in items]
    common, _ = Counter(shapes).most_common(1)[0]
    odd = next((k for k, shape in enumerate(shapes) if shape != common), None)
    name = getattr(collate, "__qualname__", type(collate).__name__)
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if odd is None:
        return (
            f"data: {name} cannot batch {names[0]}..{names[-1]}, all shaped {common} "
            f"({type(exc).__name__}: {cause}); check data.collate_fn"
        )
    like = shapes.index(common)
    return (
        f"data._target_: {names[odd]} has shape {shapes[odd]}, unlike {names[like]}'s "
        f"{common}, so {name} cannot batch them ({cause}); make every item the same shape, "
        "or name a data.collate_fn that pads"
    )


def shape_of(item: Any) -> str:
    """An item's structure with each array's shape: ([16, 48], [16]), {'x': [16, 48]}."""
    if isinstance(item, torch.Tensor | np.ndarray):
        return str(list(item.shape))
    if isinstance(item, dict):
        return "{" + ", ".join(f"{k!r}: {shape_of(v)}" for k, v in item.items()) + "}"
    if isinstance(item, list | tuple):
        return "(" + ", ".join(shape_of(v) for v in item) + ")"
    return type(item).__name__


def raise_failure(batches: list[Any]) -> list[Any]:
    """A step's batches, or the UserError a worker's CollateFailure stands for."""
    if batches and isinstance(batches[0], CollateFailure):
        raise UserError(batches[0].message)
    return batches


class ItemOrder(SampleOrder):
    """SampleOrder over a Dataset's items: one global shuffle per epoch (or the items in
    order), and with drop_last only the first `keep` of each epoch."""

    def __init__(self, seed: int, split: str, num_items: int, shuffle: bool, keep: int = 0):
        super().__init__(seed, split, num_items, 1, 1, 0)
        self.shuffle = shuffle
        self.keep = keep

    @property
    def epoch_len(self) -> int:
        return self.keep or self.num_anchors

    def epoch(self, e: int) -> np.ndarray:
        return super().epoch(e) if self.shuffle else np.arange(self.num_anchors)


class ItemSteps(Dataset):
    """Item s: this rank's micro-batches of step s, each collated from dataset items."""

    def __init__(self, dataset: Dataset, order: ItemOrder, plan: SamplePlan, collate: Collate):
        self.dataset = dataset
        self.order = order
        self.plan = plan
        self.collate = collate

    def __getitem__(self, step: int) -> list[Any]:
        p = self.plan
        g = p.global_batch_size
        ids = self.order.ids(step * g, (step + 1) * g)
        out = []
        for m in range(p.grad_accum):
            lo = (m * p.world_size + p.rank) * p.micro_batch_size
            picked = [int(i) for i in ids[lo : lo + p.micro_batch_size]]
            try:
                items = [self.dataset[i] for i in picked]
                out.append(collated(self.collate, items, [f"item {i}" for i in picked]))
            except UserError as exc:
                return [CollateFailure(str(exc))]
        return out


class MapLoader(StepLoader):
    """A map-style Dataset's steps, fetched in order by torch DataLoader workers."""

    def __init__(
        self,
        dataset: Dataset,
        order: ItemOrder,
        plan: SamplePlan,
        collate: Collate,
        num_workers: int = 2,
        prefetch: int = 2,
        pin_memory: bool = False,
    ):
        super().__init__(plan, num_workers, prefetch, pin_memory)
        self.dataset = dataset
        self.order = order
        self.collate = collate

    def steps(self) -> ItemSteps:
        return ItemSteps(self.dataset, self.order, self.plan, self.collate)

    def epoch_len(self) -> int:
        return self.order.epoch_len

    def __next__(self) -> tuple[int, list[Any]]:
        step, batches = super().__next__()
        return step, raise_failure(batches)

    def batch(self, step: int) -> list[Any]:
        return raise_failure(super().batch(step))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "num_items": self.order.num_anchors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The position; refused in one line when the Dataset's length changed (the epoch
        orders, and so every later batch, would differ)."""
        if "num_items" in state and int(state["num_items"]) != self.order.num_anchors:
            raise UserError(
                f"data: the checkpoint's Dataset had {state['num_items']} items, this one has "
                f"{self.order.num_anchors}; resume on the same data (or start a new run)",
                EXIT_RESUME_REFUSED,
            )
        super().load_state_dict(state)


def _pinned(batch: Any) -> Any:
    return tree_map(lambda t: t.pin_memory() if isinstance(t, torch.Tensor) else t, batch)


class StreamLoader:
    """An IterableDataset read by torchdata's StatefulDataLoader (samples, not batches, so
    its state does not depend on the micro-batch size), this rank's shard of it
    (toolkit.data.streams): each step takes micro_batch_size * grad_accum samples. A finite
    stream ends its epoch and starts the next (`epoch` counts them); a step may span two."""

    def __init__(
        self,
        dataset: IterableDataset,
        plan: SamplePlan,
        collate: Collate,
        num_workers: int = 2,
        prefetch: int = 2,
        pin_memory: bool = False,
        name: str = "data._target_",
    ):
        self.plan = plan
        self.collate = collate
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.name = name
        self.stream = sharded(dataset, plan.rank, plan.world_size)
        self.next_step = 0
        self.epoch = 0  # of the last step handed out (its last sample)
        self._epoch_samples = 0  # samples this rank took in the current epoch
        self._stream_state: dict[str, Any] | None = None
        self._checked = False  # shards_itself: the ranks' first batches compared
        self._loader = None
        self._iter = None

    def _open(self):
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.stream.set_epoch(self.epoch)
        self._loader = StatefulDataLoader(
            self.stream,
            batch_size=None,
            **worker_options(self.num_workers, self.prefetch),
        )
        if self._stream_state is not None:
            self._loader.load_state_dict(self._stream_state)
        with _preemption_signals_blocked():
            self._iter = iter(self._loader)
        atexit.register(self.close)  # workers ignore SIGTERM: see toolkit.data.loader

    def _own_state(self) -> dict[str, Any] | None:
        return self._loader.state_dict() if self._loader is not None else self._stream_state

    def state_dict(self) -> dict[str, Any]:
        """The position: the step, the epoch and every rank's stream state (each rank reads
        its own shard, and the checkpoint's train state is rank 0's: the states are
        gathered, one all_gather_object, which is why every rank must call this)."""
        own = {"stream": self._own_state(), "epoch": self.epoch, "taken": self._epoch_samples}
        return {
            "next_step": self.next_step,
            "seed": self.plan.seed,
            "num_workers": self.num_workers,
            "world_size": self.plan.world_size,
            "epoch": self.epoch,
            "ranks": {str(r): state for r, state in gathered((self.plan.rank, own))},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's stream states; or only a step, which must be where the stream is
        (a stream cannot seek)."""
        step = int(state["next_step"])
        if "ranks" not in state:
            if "stream" in state:  # a checkpoint of before the streams were sharded
                raise UserError(
                    f"{self.name}: the checkpoint's stream was read whole by every rank; this "
                    "version shards it, so it cannot resume it exactly (start a new run)",
                    EXIT_RESUME_REFUSED,
                )
            if step != self.next_step:
                raise UserError(
                    f"{self.name}: an IterableDataset cannot seek to step {step} without a "
                    "checkpoint's stream state",
                    EXIT_RESUME_REFUSED,
                )
            return
        if int(state["world_size"]) != self.plan.world_size:
            raise UserError(
                f"{self.name}: the checkpoint's stream was split over {state['world_size']} "
                f"data-parallel ranks, each with its own position; resume on "
                f"{state['world_size']} (this job has {self.plan.world_size})",
                EXIT_RESUME_REFUSED,
            )
        if int(state["num_workers"]) != self.num_workers:
            raise UserError(
                f"data.num_workers={self.num_workers}: the checkpoint's stream was read by "
                f"{state['num_workers']} workers, whose states it holds; resume with "
                f"data.num_workers={state['num_workers']}",
                EXIT_RESUME_REFUSED,
            )
        own = state["ranks"].get(str(self.plan.rank))
        if own is None:
            raise UserError(
                f"{self.name}: the checkpoint holds no stream state of data-parallel rank "
                f"{self.plan.rank}; resume it as it was saved",
                EXIT_RESUME_REFUSED,
            )
        self.close()
        self.next_step = step
        self.epoch = int(own["epoch"])
        self._epoch_samples = int(own["taken"])
        self._stream_state = own["stream"]

    def batch(self, step: int) -> list[Any]:
        raise UserError(f"{self.name}: an IterableDataset cannot serve validation; use data.val")

    def __iter__(self):
        return self

    def _sample(self) -> Any:
        """The stream's next sample of this rank; at the end of an epoch, the next epoch's
        first (the dataset read again from its start, set_epoch first where it has it)."""
        if self._iter is None:
            self._open()
        try:
            item = next(self._iter)
        except StopIteration:
            if self._epoch_samples == 0:
                raise UserError(
                    f"{self.name}: the stream gave rank {self.plan.rank} no sample in epoch "
                    f"{self.epoch} (reader shards: {self.plan.world_size} ranks x "
                    f"{max(1, self.num_workers)} workers); give it more items, or fewer "
                    "ranks or data.num_workers"
                ) from None
            self.close()
            self._stream_state = None
            self.epoch += 1
            self._epoch_samples = 0
            self._open()
            return self._sample()
        self._epoch_samples += 1
        return item

    def __next__(self) -> tuple[int, list[Any]]:
        p = self.plan
        out = []
        for m in range(p.grad_accum):
            samples = [self._sample() for _ in range(p.micro_batch_size)]
            first = (self.next_step * p.grad_accum + m) * p.micro_batch_size
            names = [
                f"sample {first + k} of rank {p.rank}'s stream"
                if p.world_size > 1
                else f"sample {first + k} of the stream"
                for k in range(p.micro_batch_size)
            ]
            batch = collated(self.collate, samples, names)
            out.append(_pinned(batch) if self.pin_memory else batch)
        if not self._checked:
            self._checked = True
            if self.stream.mode == "itself":
                warn_if_ranks_read_the_same(out, p, self.name)
        step = self.next_step
        self.next_step += 1
        return step, out

    def close(self) -> None:
        atexit.unregister(self.close)
        if self._loader is not None:
            self._stream_state = self._loader.state_dict()
        if self._iter is not None:
            shutdown = getattr(self._iter, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self._iter = None
        self._loader = None


def gathered(own: Any) -> list[Any]:
    """Every rank's `own`, in rank order (one all_gather_object; [own] alone without a
    process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [own]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, own)
    return out


def digest(batch: Any) -> str:
    """A hash of a micro-batch's tensors (their bytes, in order)."""
    import hashlib

    h = hashlib.sha256()
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor):
            h.update(leaf.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()


def leaves(batch: Any) -> list[Any]:
    """A micro-batch's tensors and other values, depth first (dict values in key order)."""
    if isinstance(batch, dict):
        return [x for k in sorted(batch, key=str) for x in leaves(batch[k])]
    if isinstance(batch, list | tuple):
        return [x for v in batch for x in leaves(v)]
    return [batch]


def warn_if_ranks_read_the_same(batches: list[Any], plan: SamplePlan, name: str) -> None:
    """A dataset that shards itself, checked once: when data-parallel ranks' first batches
    are equal, every rank reads the same stream (one warning line, on rank 0)."""
    import torch.distributed as dist

    if plan.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return
    mine = (plan.rank, digest(batches[0]))
    by_rank = dict(gathered(mine))  # tensor-parallel peers share a data rank
    if len(by_rank) > 1 and len(set(by_rank.values())) == 1 and dist.get_rank() == 0:
        log.warning(
            "%s: shards_itself is set, yet all %d data-parallel ranks read the same first "
            "batch: every rank reads the whole stream (split it by torch.distributed's rank "
            "in __iter__, or drop shards_itself and let the toolkit shard it)",
            name,
            len(by_rank),
        )


def map_loader(
    dataset: Dataset, cfg: DatasetConfig, plan: SamplePlan, split: str, pin_memory: bool
) -> MapLoader:
    n = len(dataset)
    g = plan.global_batch_size
    if n < 1 or (cfg.drop_last and n < g):
        raise UserError(
            f"data._target_={cfg.target}: {n} items ({split}), fewer than one global batch of {g}"
        )
    order = ItemOrder(plan.seed, split, n, cfg.shuffle, n - n % g if cfg.drop_last else 0)
    workers = cfg.num_workers if split == "train" else 0
    return MapLoader(
        dataset, order, plan, collate_of(cfg.collate_fn), workers, cfg.prefetch, pin_memory
    )


def build_loaders(
    cfg: DatasetConfig, plan: SamplePlan, pin_memory: bool, dataset: Any = None
) -> tuple[MapLoader | StreamLoader, MapLoader | None]:
    """Training and validation loaders of your own Dataset (validation: `data.val`, or the
    last `data.val_fraction` of a map-style Dataset's items; else none). `dataset`: the
    Dataset already built (toolkit.data.device), else built here."""
    import dataclasses

    dataset = build(cfg.target, cfg.kwargs) if dataset is None else dataset
    val_plan = dataclasses.replace(plan, grad_accum=1)
    val = None
    if cfg.val is not None:
        node = {k: v for k, v in cfg.val.items() if k != "_target_"}
        val_set = build(str(cfg.val["_target_"]), node, "data.val._target_")
        if isinstance(val_set, IterableDataset):
            raise UserError(
                f"data.val._target_={cfg.val['_target_']}: validation needs a map-style Dataset"
            )
        val = map_loader(val_set, cfg, val_plan, "val", False)
    if isinstance(dataset, IterableDataset):
        if cfg.val_fraction > 0:
            raise UserError(
                f"data.val_fraction={cfg.val_fraction}: {cfg.target} is an IterableDataset, which "
                "cannot be split; use data.val (a map-style Dataset)"
            )
        stream = StreamLoader(
            dataset,
            plan,
            collate_of(cfg.collate_fn),
            cfg.num_workers,
            cfg.prefetch,
            pin_memory,
            f"data._target_={cfg.target}",
        )
        return stream, val
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise UserError(
            f"data._target_={cfg.target}: not a torch Dataset (needs __getitem__ and __len__, "
            "or an IterableDataset)"
        )
    if cfg.val_fraction > 0:
        n = len(dataset)
        cut = n - max(1, int(n * cfg.val_fraction))
        val = map_loader(Subset(dataset, range(cut, n)), cfg, val_plan, "val", False)
        dataset = Subset(dataset, range(cut))
    return map_loader(dataset, cfg, plan, "train", pin_memory), val
