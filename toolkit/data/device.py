"""Device-resident data: samples cut on the training device by index arithmetic, one gather
per micro-batch, no DataLoader workers and no host-to-device copy per step
(`data.placement=auto|device|host`, `data.device_budget_mib`; docs/data.md).

The sample order is the host loader's (toolkit.data.samples.SampleOrder, the same seed and
positions), and so are the rank slices of a step's global batch, the state_dict and its
resume on any world size: the batches equal the host loader's bitwise and a checkpoint of one
path resumes on the other. Tables that fit the budget are copied once (resident); tables that
do not stream in chunks of steps from host memory (toolkit.data.chunks), or, where even one
step does not fit, the host loader takes over: never an out-of-memory error.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from toolkit.config.data import DataConfig, DatasetConfig
from toolkit.data.chunks import ChunkStream, window_rows
from toolkit.data.loader import SamplePlan, epoch_of, host_loaders, market_windows
from toolkit.data.samples import Normalisation
from toolkit.data.tables import DeviceWindows, MarketTables, TensorTables, as_tensor
from toolkit.data.user import build, map_loader
from toolkit.data.user import build_loaders as user_loaders
from toolkit.errors import EXIT_RESUME_REFUSED, UserError

log = logging.getLogger(__name__)

MiB = 1 << 20
KEYS_PER_CHUNK = 1 << 20  # samples whose keys one resident chunk carries (16 MiB of int64)


class Source(Protocol):
    """What DeviceLoader cuts: DeviceWindows (the market) or TensorTables (your arrays)."""

    order: Any  # toolkit.data.samples.SampleOrder
    window_rows: int  # table rows a sample reads, ending at its key row
    rows_per_id: int  # samples an id of the order stands for (keys() expands it)

    def host_tables(self) -> list[torch.Tensor]: ...
    def device_tables(self, device: torch.device) -> list[torch.Tensor]: ...
    def keys(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]: ...
    def cut(self, tables: list[torch.Tensor], rows: torch.Tensor, subs: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a loader's samples are cut, and the line the run's log starts with."""

    path: str  # resident | streamed | host
    line: str
    steps_per_chunk: int = 0  # streamed


def mib(num_bytes: float) -> str:
    """38 MiB, 1,024 MiB; 1.17 MiB and 0.10 MiB below 10 (unless whole)."""
    value = num_bytes / MiB
    return f"{value:,.0f} MiB" if value >= 10 or value == int(value) else f"{value:.2f} MiB"


def host_available_bytes() -> int:
    """MemAvailable of /proc/meminfo (else the physical memory)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget_bytes(device: torch.device, ranks_per_host: int) -> int:
    """data.device_budget_mib=null: half the device's free memory; on the CPU, whose memory
    the node's ranks share, a quarter of the available memory over those ranks."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return host_available_bytes() // 4 // max(1, ranks_per_host)


def place(
    placement: str,
    table_bytes: int,
    step_bytes: int,
    budget_bytes: int,
    epoch_steps: int,
    unavailable: str | None = None,
) -> Placement:
    """Resident when the tables fit the budget (auto, device); streamed in chunks of steps
    when not, each chunk at most half the budget (two are alive); the host loader when
    data.placement=host, when the data cannot be cut on the device (`unavailable` says why),
    or when one step's worst case does not fit half the budget."""
    if placement == "host":
        return Placement("host", "data: host loader (data.placement=host)")
    if unavailable is not None:
        if placement == "device":
            raise UserError(f"data.placement=device: {unavailable}; use data.placement=auto")
        return Placement("host", f"data: host loader ({unavailable})")
    budget = f"a {mib(budget_bytes)} budget"
    steps = min((budget_bytes // 2) // max(1, step_bytes), epoch_steps)
    if table_bytes <= budget_bytes:
        line = f"data: device-resident, {mib(table_bytes)} of {budget}"
        return Placement("resident", line)
    host_share = host_available_bytes() // 2
    if table_bytes > host_share:
        return Placement(
            "host",
            f"data: host loader ({mib(table_bytes)} of tables do not fit {budget}, nor half "
            f"the host's available memory, {mib(host_share)}, to stream from)",
        )
    if steps < 1:
        return Placement(
            "host",
            f"data: host loader ({mib(table_bytes)} do not fit {budget}, and one step's "
            f"{mib(step_bytes)} do not fit half of it; raise data.device_budget_mib)",
        )
    chunks = math.ceil(epoch_steps / steps)
    return Placement(
        "streamed",
        f"data: streamed in {chunks} chunks of {steps} steps per epoch, at most "
        f"{mib(min(table_bytes, steps * step_bytes))} each ({mib(table_bytes)} of tables "
        f"over {budget})",
        steps,
    )


class DeviceLoader:
    """The Loader contract (toolkit.data.loader.Loader) over tables on the device: step s's
    micro-batches are gathers at the keys of positions [s * g, (s + 1) * g) of the sample
    order, this rank's slices of them as every loader takes them."""

    def __init__(
        self,
        source: Source,
        plan: SamplePlan,
        device: torch.device,
        steps_per_chunk: int = 0,
    ):
        self.source = source
        self.plan = plan
        self.device = torch.device(device)
        self.steps_per_chunk = steps_per_chunk  # 0: resident
        self.next_step = 0
        self._stream: ChunkStream | None = None
        self._chunk = None
        self._chunk_steps = 0

    @property
    def epoch(self) -> int:
        """As the host loaders count it (toolkit.data.loader.epoch_of)."""
        return epoch_of(self.next_step, self.plan.global_batch_size, self.source.order.epoch_len)

    @property
    def resident(self) -> bool:
        return self.steps_per_chunk == 0

    def _open(self) -> None:
        g = self.plan.global_batch_size
        src = self.source
        tables = self._resident_tables() if self.resident else None
        if tables is not None:
            self._chunk_steps = max(1, min(KEYS_PER_CHUNK // g, -(-src.order.epoch_len // g)))
        else:
            self._chunk_steps = self.steps_per_chunk
            tables = None
        host = src.host_tables()
        num_rows = len(host[0])
        steps = self._chunk_steps

        def plan(k: int):
            ids = src.order.ids(k * steps * g, (k + 1) * steps * g)
            rows, subs = src.keys(ids)
            if tables is not None:
                return None, rows, subs
            needed = window_rows(rows, src.window_rows, num_rows)
            return needed, np.searchsorted(needed, rows), subs

        self._stream = ChunkStream(host, plan, self.device, tables)
        self._stream_of = g

    def _resident_tables(self) -> list[torch.Tensor] | None:
        """The tables on the device; None, and streamed from now on, when the device's
        memory no longer holds them (never an out-of-memory error for the data)."""
        try:
            return self.source.device_tables(self.device)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
        # The budget came from the free memory before training; a quarter of what is free
        # now per chunk (two chunks alive), at least one step.
        host = self.source.host_tables()
        row_bytes = sum(t[0].nbytes for t in host)
        step_bytes = self.plan.global_batch_size * self.source.window_rows * row_bytes
        free = torch.cuda.mem_get_info(self.device)[0]
        epoch_steps = -(-self.source.order.epoch_len // self.plan.global_batch_size)
        self.steps_per_chunk = max(1, min(epoch_steps, (free // 4) // max(1, step_bytes)))
        log.warning(
            "data: the tables no longer fit the device's memory; streamed in chunks of %d "
            "steps instead (set data.device_budget_mib)",
            self.steps_per_chunk,
        )
        return None

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, list[Any]]:
        p = self.plan
        if self._stream is None or self._stream_of != p.global_batch_size:
            self.close()
            self._open()
        k, j = divmod(self.next_step, self._chunk_steps)
        if self._chunk is None or self._chunk.index != k:
            self._chunk = None  # two chunks alive at most: this one's copy and the next's
            self._chunk = self._stream.get(k)
        chunk = self._chunk
        out = []
        per = self.source.rows_per_id  # validation by whole cross-sections: an id is n rows
        for m in range(p.grad_accum):
            lo = j * p.global_batch_size + (m * p.world_size + p.rank) * p.micro_batch_size
            lo, hi = lo * per, (lo + p.micro_batch_size) * per
            subs = chunk.subs[lo:hi] if chunk.subs is not None else None
            out.append(self.source.cut(chunk.tables, chunk.rows[lo:hi], subs))
        step = self.next_step
        self.next_step += 1
        return step, out

    def batch(self, step: int) -> list[Any]:
        """Step `step`'s micro-batches, cut here (evaluation): from the resident tables, or
        from the host's and then copied (streamed data)."""
        p = self.plan
        g = p.global_batch_size
        ids = self.source.order.ids(step * g, (step + 1) * g)
        tables = self._resident_tables() if self.resident else None
        on = self.device if tables is not None else torch.device("cpu")
        tables = tables if tables is not None else self.source.host_tables()
        out = []
        for m in range(p.grad_accum):
            lo = (m * p.world_size + p.rank) * p.micro_batch_size
            rows, subs = self.source.keys(ids[lo : lo + p.micro_batch_size])
            rows_t = torch.from_numpy(rows).to(on)
            subs_t = torch.from_numpy(subs).to(on) if subs is not None else None
            cut = self.source.cut(tables, rows_t, subs_t)
            out.append(cut if on == self.device else _to(cut, self.device))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"next_step": self.next_step, "seed": self.plan.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self.next_step = int(state["next_step"])

    def close(self) -> None:
        self._chunk = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return type(batch)(_to(v, device) for v in batch)


class MarketDeviceLoader(DeviceLoader):
    """The market's samples on the device; its state is the host loader's (DatasetLoader):
    the position and the normalisation, so either path resumes the other's checkpoint."""

    def __init__(
        self,
        windows: DeviceWindows,
        plan: SamplePlan,
        device: torch.device,
        steps_per_chunk: int = 0,
    ):
        super().__init__(windows, plan, device, steps_per_chunk)
        self.windows = windows
        self.also_normalises: list[DeviceWindows] = []

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "normalisation": self.windows.norm.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "normalisation" in state:
            norm = Normalisation.from_dict(state["normalisation"])
            for windows in [self.windows, *self.also_normalises]:
                windows.norm = windows.source.norm = norm


class TensorDeviceLoader(DeviceLoader):
    """Your arrays on the device; its state is the host MapLoader's (the position and the
    number of items, a resume on other data refused in one line)."""

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "num_items": self.source.order.num_anchors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "num_items" in state and int(state["num_items"]) != self.source.order.num_anchors:
            raise UserError(
                f"data: the checkpoint's Dataset had {state['num_items']} items, this one has "
                f"{self.source.order.num_anchors}; resume on the same data (or start a new run)",
                EXIT_RESUME_REFUSED,
            )
        super().load_state_dict(state)


def budget_of(cfg: DataConfig | DatasetConfig, device: torch.device, ranks_per_host: int) -> int:
    if cfg.device_budget_mib is not None:
        return cfg.device_budget_mib * MiB
    return default_budget_bytes(device, ranks_per_host)


def market_loaders(
    cfg: DataConfig,
    plan: SamplePlan,
    num_series: int,
    num_targets: int,
    device: torch.device,
    pin_memory: bool,
    run_dir: Path | None = None,
    ranks_per_host: int = 1,
) -> tuple[Any, Any, Placement]:
    """data=returns: training and validation loaders where data.placement puts them, and
    the placement (its line for the run's log)."""
    train, val = market_windows(cfg, plan, num_series, num_targets, run_dir)
    num_rows = int(max(train.anchors[-1], val.anchors[-1])) + 1 + train.spec.horizon
    table_bytes = MarketTables.nbytes_of(train, num_rows)
    step_bytes = plan.global_batch_size * train.spec.lookback * (table_bytes // num_rows)
    epoch_steps = -(-train.order.epoch_len // plan.global_batch_size)
    budget = budget_of(cfg, device, ranks_per_host) if cfg.placement != "host" else 0
    placement = place(cfg.placement, table_bytes, step_bytes, budget, epoch_steps)
    if placement.path == "host":
        return (*host_loaders(cfg, plan, train, val, pin_memory), placement)
    tables = MarketTables(train, num_rows)
    windows = [DeviceWindows(w, tables) for w in (train, val)]
    loader = MarketDeviceLoader(windows[0], plan, device, placement.steps_per_chunk)
    val_plan = dataclasses.replace(plan, grad_accum=1)
    val_loader = MarketDeviceLoader(windows[1], val_plan, device, placement.steps_per_chunk)
    loader.also_normalises.append(windows[1])
    return loader, val_loader, placement


def tensors_of(dataset: Any, where: str) -> Any:
    """`dataset.tensors()` checked: a tuple/list or dict of arrays or tensors, equally long."""
    arrays = dataset.tensors()
    values = list(arrays.values()) if isinstance(arrays, dict) else arrays
    if not isinstance(values, list | tuple) or not values:
        raise UserError(
            f"{where}.tensors(): returned {type(arrays).__name__}; return a tuple "
            "or dict of arrays with one row per item"
        )
    lengths = {len(v) for v in values}
    if len(lengths) != 1 or not all(hasattr(v, "shape") for v in values):
        raise UserError(
            f"{where}.tensors(): arrays of lengths {sorted(lengths)}; every "
            "array needs one row per item"
        )
    return arrays


def tensor_order(cfg: DatasetConfig, plan: SamplePlan, split: str, n: int) -> Any:
    from toolkit.data.user import ItemOrder

    g = plan.global_batch_size
    if n < 1 or (cfg.drop_last and n < g):
        raise UserError(
            f"data._target_={cfg.target}: {n} items ({split}), fewer than one global batch of {g}"
        )
    return ItemOrder(plan.seed, split, n, cfg.shuffle, n - n % g if cfg.drop_last else 0)


def dataset_loaders(
    cfg: DatasetConfig,
    plan: SamplePlan,
    device: torch.device,
    pin_memory: bool,
    ranks_per_host: int = 1,
) -> tuple[Any, Any, Placement]:
    """data._target_: a Dataset with `tensors()` on the device (its items must be the rows
    of those arrays, as default_collate batches them); any other Dataset on the host
    (toolkit.data.user)."""
    dataset = build(cfg.target, cfg.kwargs)
    unavailable = None
    if not callable(getattr(dataset, "tensors", None)):
        unavailable = f"{type(dataset).__name__} has no tensors() method"
    elif cfg.collate_fn is not None:
        unavailable = "data.collate_fn is set; the device path cuts default_collate batches"
    arrays = None
    if unavailable is None and cfg.placement != "host":
        arrays = tensors_of(dataset, f"data._target_={cfg.target}")
    values = (list(arrays.values()) if isinstance(arrays, dict) else arrays) or []
    table_bytes = sum(as_tensor(v).nbytes for v in values)
    n = len(values[0]) if values else 0
    cut = n - max(1, int(n * cfg.val_fraction)) if cfg.val_fraction > 0 else n
    g = plan.global_batch_size
    budget = budget_of(cfg, device, ranks_per_host) if arrays is not None else 0
    step_bytes = g * (table_bytes // max(n, 1))
    placement = place(cfg.placement, table_bytes, step_bytes, budget, -(-cut // g), unavailable)
    if placement.path == "host":
        return (*user_loaders(cfg, plan, pin_memory, dataset), placement)
    steps = placement.steps_per_chunk
    val_plan = dataclasses.replace(plan, grad_accum=1)
    shared: dict = {}
    train = TensorTables(arrays, tensor_order(cfg, plan, "train", cut), 0, shared)
    val = None
    if cut < n:  # data.val_fraction: the last items, the same tables
        val_order = tensor_order(cfg, val_plan, "val", n - cut)
        val_tables = TensorTables(arrays, val_order, cut, shared)
        val = TensorDeviceLoader(val_tables, val_plan, device, steps)
    elif cfg.val is not None:
        node = {k: v for k, v in cfg.val.items() if k != "_target_"}
        val_set = build(str(cfg.val["_target_"]), node, "data.val._target_")
        if callable(getattr(val_set, "tensors", None)):
            val_arrays = tensors_of(val_set, f"data.val._target_={cfg.val['_target_']}")
            val_tables = TensorTables(val_arrays, None)
            val_tables.order = tensor_order(cfg, val_plan, "val", len(val_tables.host[0]))
            val = TensorDeviceLoader(val_tables, val_plan, device, steps)
        else:
            val = map_loader(val_set, cfg, val_plan, "val", False)
    return TensorDeviceLoader(train, plan, device, steps), val, placement
