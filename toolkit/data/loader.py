"""The training loop's data contract (`Loader`), the torch DataLoader machinery every
built-in and user dataset shares (`StepLoader`), and the market dataset's batches.

Why torch's DataLoader workers and not a pool of our own: the batch of step s is a pure
function of (seed, s) (toolkit.data.samples.SampleOrder, toolkit.data.tokens.BatchPlan), so
a map-style dataset indexed by step gives in-order delivery, pinned-memory batches, worker
start-up and error propagation for free, and workers hold no state worth saving: the
position is the next step. Resuming (or resharding) rebuilds the DataLoader at that step.

Rank r takes, for micro-step m, the slice [(m * world + r) * micro, +micro) of the step's
global batch, as every loader does: with a fixed global batch the samples a step sees do
not depend on the world size, nor on the number of workers.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import multiprocessing
import signal
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from toolkit.config.data import DataConfig
from toolkit.config.shape import BatchShape
from toolkit.data.manifest import DataError
from toolkit.data.reader import DatasetReader
from toolkit.data.samples import Normalisation, SampleOrder, SampleSpec, fit_normalisation
from toolkit.data.training import Opened, open_dataset


@runtime_checkable
class Loader(Protocol):
    """What the Trainer calls of its data, whatever the dataset (text and synthetic tokens:
    toolkit.data.tokens; the market: DatasetLoader below; your own: toolkit.data.user).

    Data-wait accounting: the Trainer counts the wall time of `next(loader)` as the step's
    `data_wait_s` (and as part of its step time), so `__next__` only hands over what was
    prepared ahead (by DataLoader workers, or a stream's reader); a loader that computes a
    step inside `__next__` (num_workers=0) shows that work as data wait, as it should."""

    plan: BatchShape  # this rank's place in the global batch; replaced on a resharded resume

    def __next__(self) -> tuple[int, list[Any]]:
        """(step, this rank's micro-batches of that step), steps in order from the position."""
        ...

    def batch(self, step: int) -> list[Any]:
        """Step `step`'s micro-batches, computed in this process (evaluation)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position (JSON-able): `next_step`, the seed, and what else resuming needs."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to a checkpoint's position (also `{"next_step": s}` alone); stops workers."""
        ...

    def close(self) -> None:
        """Stop workers and threads; the loader may be iterated again afterwards."""
        ...

    @property
    def epoch(self) -> int:
        """The epoch (0-based) of the step handed out last: the position of its first
        sample over the samples in an epoch (epoch_of), or the epochs a stream has ended."""
        ...


def epoch_of(next_step: int, global_batch_size: int, epoch_len: int) -> int:
    """The epoch of the step before `next_step` (0 before any): its first sample's position
    over the samples in an epoch (0 when there are no epochs)."""
    return max(0, next_step - 1) * global_batch_size // epoch_len if epoch_len > 0 else 0


NEVER = 1 << 62  # the step sampler's end: training stops by step count, not by the sampler


SamplePlan = BatchShape  # the same shape as the text loader's plan (Trainer re-splits it)


class Windows:
    """Cuts normalised (inputs, target) samples of one split out of a dataset reader.

    whole_cross_sections (per_instrument validation): the order's ids are anchors, each
    expanded to its instruments' samples in instrument order, so a batch's rows come in
    groups of one time step and the information coefficient can be taken per time step."""

    def __init__(
        self,
        reader: DatasetReader,
        spec: SampleSpec,
        anchors: np.ndarray,
        features: list[int],
        norm: Normalisation,
        order: SampleOrder,
        whole_cross_sections: bool = False,
    ):
        self.whole_cross_sections = whole_cross_sections
        self.reader = reader
        self.spec = spec
        self.anchors = anchors  # the split's anchor time steps (toolkit.data.samples.gap_free)
        self.features = features
        self.norm = norm
        self.order = order
        self.num_instruments = reader.manifest.shape[1]

    def _scale(self) -> tuple[np.ndarray, np.ndarray]:
        if getattr(self, "_scale_of", None) is not self.norm:  # a resume may replace norm
            self._scale_of, self._scale_arrays = self.norm, self.norm.arrays()
        return self._scale_arrays

    def window(self, sample_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw values and mask of one sample: [lookback + horizon, instruments, features]
        (one instrument in per_instrument mode); a view into a cached chunk when it can be."""
        s = self.spec
        per = self.num_instruments if s.mode == "per_instrument" else 1
        a, instrument = divmod(int(sample_id), per)
        t = self.anchors[a]
        values, mask = self.reader.window(t - s.lookback + 1, t + s.horizon + 1)
        if s.mode == "per_instrument":
            return values[:, instrument : instrument + 1], mask[:, instrument : instrument + 1]
        return values, mask

    def batch(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs [batch, lookback, width] normalised with training statistics, missing as 0;
        targets [batch, targets], the normalised target feature summed over the horizon, NaN
        where any step of it is missing. Arithmetic on the whole batch at once."""
        s = self.spec
        if self.whole_cross_sections:
            n = self.num_instruments
            ids = (np.asarray(ids)[:, None] * n + np.arange(n)[None, :]).ravel()
        pairs = [self.window(i) for i in ids]
        values = np.stack([p[0] for p in pairs])
        mask = np.stack([p[1] for p in pairs])
        mean, std = self._scale()
        z = (values - mean) / std
        inputs = np.where(mask[:, : s.lookback], z[:, : s.lookback], 0.0)
        if len(self.features) != z.shape[-1]:
            inputs = inputs[..., self.features]
        ahead = z[:, s.lookback :, :, s.target]
        observed = mask[:, s.lookback :, :, s.target].all(axis=1)
        target = np.where(observed, ahead.sum(axis=1), np.nan)
        x = inputs.reshape(len(ids), s.lookback, -1).astype(np.float32, copy=False)
        return torch.from_numpy(x), torch.from_numpy(target.astype(np.float32, copy=False))


class StepBatches(Dataset):
    """Item s: this rank's micro-batches of step s."""

    def __init__(self, windows: Windows, plan: SamplePlan):
        self.windows = windows
        self.plan = plan

    def __getitem__(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        p = self.plan
        g = p.global_batch_size
        ids = self.windows.order.ids(step * g, (step + 1) * g)
        out = []
        for m in range(p.grad_accum):
            lo = (m * p.world_size + p.rank) * p.micro_batch_size
            out.append(self.windows.batch(ids[lo : lo + p.micro_batch_size]))
        return out


PREEMPTION_SIGNALS = {signal.SIGUSR2, signal.SIGTERM}


@contextlib.contextmanager
def _preemption_signals_blocked():
    """Blocked while workers start: a fork inherits the mask, so a signal that arrives
    before a worker has set SIG_IGN waits instead of killing it; the training process gets
    its own pending signals when the mask is restored."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _ignore_preemption_signals(_worker_id: int) -> None:
    """Workers must survive SIGUSR2/SIGTERM: the training process handles them at a step
    boundary (toolkit.executors.preemption) and closes the loader itself."""
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPTION_SIGNALS)
    torch.set_num_threads(1)


def worker_start_method(num_workers: int) -> str | None:
    """How the loader's workers start: Python's default (fork on Linux), except where that
    default is spawn, which a rank started by torch.multiprocessing.spawn inherits: there,
    forkserver. A spawned worker ends through the interpreter's finalization while its
    queue's feeder thread may still be handing a batch's storage over; that thread then
    exits inside torch's C++ code and the worker aborts ("terminate called without an active
    exception", 21 of 60 closes on the dev VM). A forkserver child ends with os._exit, as a
    forked one does; it needs a picklable dataset, as a spawned one does."""
    if not num_workers:
        return None
    current = multiprocessing.get_start_method(allow_none=True)
    current = current or multiprocessing.get_all_start_methods()[0]
    if current == "spawn" and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return None


def worker_options(num_workers: int, prefetch: int) -> dict[str, Any]:
    """A DataLoader's worker arguments, as every loader here sets them: `prefetch` steps
    ahead per worker, workers that ignore preemption signals and start as
    worker_start_method says (none of it without workers)."""
    return {
        "num_workers": num_workers,
        "prefetch_factor": prefetch if num_workers else None,
        "worker_init_fn": _ignore_preemption_signals if num_workers else None,
        "multiprocessing_context": worker_start_method(num_workers),
    }


class StepLoader:
    """The Loader contract over a map-style Dataset whose item s is this rank's micro-batches
    of step s (`steps()`, built from the current plan: a resume may re-split it): torch
    DataLoader workers fetch steps in order, from `next_step` on. Subclasses add their state."""

    def __init__(self, plan: SamplePlan, num_workers: int, prefetch: int, pin_memory: bool):
        self.plan = plan
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.next_step = 0
        self._loader: DataLoader | None = None
        self._iter = None

    def steps(self) -> Dataset:
        raise NotImplementedError

    def epoch_len(self) -> int:
        """Samples in an epoch (0: no epochs)."""
        return 0

    @property
    def epoch(self) -> int:
        return epoch_of(self.next_step, self.plan.global_batch_size, self.epoch_len())

    def state_dict(self) -> dict[str, Any]:
        return {"next_step": self.next_step, "seed": self.plan.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self.next_step = int(state["next_step"])

    def batch(self, step: int) -> list[Any]:
        """Step `step`'s micro-batches, computed here (evaluation)."""
        return self.steps()[step]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, list[Any]]:
        if self._iter is None:
            self._loader = DataLoader(
                self.steps(),
                batch_size=None,
                sampler=range(self.next_step, NEVER),
                pin_memory=self.pin_memory,
                persistent_workers=False,
                **worker_options(self.num_workers, self.prefetch),
            )
            with _preemption_signals_blocked():
                self._iter = iter(self._loader)
            # Workers ignore SIGTERM, so multiprocessing's own exit handler (terminate, then
            # join) would wait forever on a loader nobody closed: close it first (atexit
            # runs the handlers registered last first).
            atexit.register(self.close)
        batches = next(self._iter)
        step = self.next_step
        self.next_step += 1
        return step, batches

    def close(self) -> None:
        atexit.unregister(self.close)
        if self._iter is not None:
            shutdown = getattr(self._iter, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            self._iter = None
            self._loader = None


class DatasetLoader(StepLoader):
    def __init__(
        self,
        windows: Windows,
        plan: SamplePlan,
        num_workers: int = 2,
        prefetch: int = 2,
        pin_memory: bool = False,
    ):
        super().__init__(plan, num_workers, prefetch, pin_memory)
        self.windows = windows
        self.also_normalises: list[Windows] = []  # validation: scaled as training is

    def steps(self) -> StepBatches:
        return StepBatches(self.windows, self.plan)

    def epoch_len(self) -> int:
        return self.windows.order.epoch_len

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "normalisation": self.windows.norm.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The position, and the checkpoint's normalisation (so a resumed run scales its
        inputs as the first run did, even if the data has grown since)."""
        super().load_state_dict(state)
        if "normalisation" in state:
            norm = Normalisation.from_dict(state["normalisation"])
            for windows in [self.windows, *self.also_normalises]:
                windows.norm = norm


def market_windows(
    cfg: DataConfig,
    plan: SamplePlan,
    num_series: int,
    num_targets: int,
    run_dir: Path | None = None,
) -> tuple[Windows, Windows]:
    """The training and validation splits' Windows (whatever loader cuts them: DatasetLoader
    below, or toolkit.data.device); normalisation from the training period only, written to
    run_dir/data_normalisation.json when given."""
    opened: Opened = open_dataset(cfg, num_series, num_targets)
    norm = fit_normalisation(opened.reader, opened.periods["train"])
    if run_dir is not None:
        (run_dir / "data_normalisation.json").write_text(json.dumps(norm.as_dict(), indent=1))
    out = []
    for split in ("train", "val"):
        anchors = opened.anchors[split]
        by_time = split == "val" and cfg.sample == "per_instrument"
        per = opened.reader.manifest.shape[1] if cfg.sample == "per_instrument" else 1
        per = 1 if by_time else per
        order = SampleOrder(
            plan.seed,
            split,
            len(anchors),
            per,
            opened.reader.manifest.chunk_len,
            cfg.shuffle_chunks,
        )
        out.append(
            Windows(opened.reader, opened.spec, anchors, opened.features, norm, order, by_time)
        )
    return out[0], out[1]


def host_loaders(
    cfg: DataConfig, plan: SamplePlan, train: Windows, val: Windows, pin_memory: bool
) -> tuple[DatasetLoader, DatasetLoader]:
    """The splits' loaders on the host: DataLoader workers cut the training steps; the
    validation batches are cut in the training process."""
    loader = DatasetLoader(train, plan, cfg.num_workers, max(cfg.prefetch, 1), pin_memory)
    val_loader = DatasetLoader(val, dataclasses.replace(plan, grad_accum=1), 0, 1, False)
    loader.also_normalises.append(val)
    return loader, val_loader


def build_loaders(
    cfg: DataConfig,
    plan: SamplePlan,
    num_series: int,
    num_targets: int,
    pin_memory: bool,
    run_dir: Path | None = None,
) -> tuple[DatasetLoader, DatasetLoader]:
    """Training and validation loaders on the host (toolkit.data.device puts them on the
    training device)."""
    train, val = market_windows(cfg, plan, num_series, num_targets, run_dir)
    return host_loaders(cfg, plan, train, val, pin_memory)


__all__ = [
    "DataError",
    "DatasetLoader",
    "Loader",
    "StepLoader",
    "SamplePlan",
    "Windows",
    "build_loaders",
    "host_loaders",
    "market_windows",
]
