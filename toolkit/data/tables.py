"""Samples as index arithmetic on whole tables: what the device-resident path
(toolkit.data.device) cuts its batches from.

The market ([time, instrument, feature]): two tables over the time steps the splits read,
`inputs` [time, instrument, feature] (normalised with the training statistics, missing as 0,
the input features only) and `targets` [time, instrument] (the target feature summed over
the horizon after each time step, NaN where any step of it is missing). A sample anchored at
t is rows [t - lookback + 1, t] of `inputs` and row t of `targets`: one gather each. The
arithmetic is the host loader's (toolkit.data.loader.Windows.batch), element for element and
in the same order, so the batches are equal bitwise.

Your own arrays (a Dataset with `tensors()`, docs/data.md): the tables are its tensors, a
sample is one row of each.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from toolkit.data.loader import Windows
from toolkit.data.samples import Normalisation, SampleOrder


def pairwise_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """sum(parts) in the order numpy sums a strided axis (its pairwise summation: blocks of
    up to 128 split in halves, eight partial sums within a block, sequential below eight)."""
    n = len(parts)
    if n < 8:
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out
    if n > 128:
        half = n // 2
        half -= half % 8
        return pairwise_sum(parts[:half]) + pairwise_sum(parts[half:])
    acc = list(parts[:8])
    i = 8
    while i <= n - 8:
        acc = [a + p for a, p in zip(acc, parts[i : i + 8], strict=True)]
        i += 8
    out = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    for p in parts[i:]:
        out = out + p
    return out


def horizon_sum(parts: list[torch.Tensor], one_instrument: bool) -> torch.Tensor:
    """The target's sum over the horizon as Windows.batch takes it: numpy sums a window of
    several instruments step after step (the instrument axis is innermost), one instrument's
    window pairwise (the time axis is)."""
    if one_instrument:
        return pairwise_sum(parts)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


class MarketTables:
    """The market's `inputs` and `targets` tables on the host (time steps [0, num_rows)),
    rebuilt when the normalisation changes (a checkpoint's replaces the fitted one)."""

    def __init__(self, windows: Windows, num_rows: int):
        self.reader = windows.reader
        self.spec = windows.spec
        self.features = windows.features
        self.num_rows = num_rows
        self.num_instruments = windows.num_instruments
        self.norm: Normalisation | None = None
        self.host: list[torch.Tensor] = []
        self._device: dict[str, list[torch.Tensor]] = {}

    @staticmethod
    def nbytes_of(windows: Windows, num_rows: int) -> int:
        return num_rows * windows.num_instruments * (len(windows.features) + 1) * 4

    def tables(self, norm: Normalisation) -> list[torch.Tensor]:
        if self.norm != norm:  # a checkpoint's normalisation equal to the fitted one: kept
            self.host = self._build(norm)
            self.norm = norm
            self._device.clear()
        return self.host

    def on(self, device: torch.device, norm: Normalisation) -> list[torch.Tensor]:
        """The tables on `device` (copied once; the host tables themselves on the CPU)."""
        host = self.tables(norm)
        if device.type == "cpu":
            return host
        if str(device) not in self._device:
            self._device[str(device)] = [t.to(device) for t in host]
        return self._device[str(device)]

    def _build(self, norm: Normalisation) -> list[torch.Tensor]:
        s = self.spec
        mean, std = norm.arrays()
        n = self.num_instruments
        inputs = torch.empty((self.num_rows, n, len(self.features)), dtype=torch.float32)
        ahead = torch.empty((self.num_rows, n), dtype=torch.float32)
        seen = torch.empty((self.num_rows, n), dtype=torch.bool)
        for t0, values, mask in self.reader.iter_chunks(0, self.num_rows):
            z = (values - mean) / std  # as Windows.batch: float32, element for element
            rows = slice(t0, t0 + len(values))
            x = np.where(mask, z, 0.0)
            if len(self.features) != z.shape[-1]:
                x = x[..., self.features]
            inputs[rows] = torch.from_numpy(np.ascontiguousarray(x, np.float32))
            ahead[rows] = torch.from_numpy(np.ascontiguousarray(z[..., s.target]))
            seen[rows] = torch.from_numpy(np.ascontiguousarray(mask[..., s.target]))
        # targets[t] sums time steps (t, t + horizon]; the last `horizon` rows have no target
        # (no anchor reaches them: a split's anchors end `horizon` before its end).
        last = self.num_rows - s.horizon
        steps = [ahead[1 + h : last + 1 + h] for h in range(s.horizon)]
        total = horizon_sum(steps, s.mode == "per_instrument")
        observed = seen[1 : last + 1].clone()
        for h in range(1, s.horizon):
            observed &= seen[1 + h : last + 1 + h]
        targets = torch.full((self.num_rows, n), float("nan"), dtype=torch.float32)
        targets[:last] = torch.where(observed, total, torch.tensor(float("nan")))
        return [inputs, targets]


class DeviceWindows:
    """One split's samples over MarketTables: keys (row, instrument) from sample ids, and
    the batch cut at those keys (Windows' settings and names, so readers of a loader's
    `windows` find what they know)."""

    window_rows: int

    def __init__(self, windows: Windows, tables: MarketTables):
        self.source = windows  # the host cut: validation batches, tests
        self.tables = tables
        self.spec = windows.spec
        self.anchors = windows.anchors
        self.order: SampleOrder = windows.order
        self.norm = windows.norm
        self.num_instruments = windows.num_instruments
        self.whole_cross_sections = windows.whole_cross_sections
        self.window_rows = windows.spec.lookback
        self.rows_per_id = windows.num_instruments if windows.whole_cross_sections else 1
        self._offsets: dict[str, torch.Tensor] = {}

    def host_tables(self) -> list[torch.Tensor]:
        return self.tables.tables(self.norm)

    def device_tables(self, device: torch.device) -> list[torch.Tensor]:
        return self.tables.on(device, self.norm)

    def keys(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Each sample's anchor row and, one instrument per sample, its instrument."""
        n = self.num_instruments
        if self.whole_cross_sections:  # anchors, each expanded to its instruments in order
            ids = (np.asarray(ids)[:, None] * n + np.arange(n)[None, :]).ravel()
        if self.spec.mode != "per_instrument":
            return self.anchors[np.asarray(ids, np.int64)], None
        anchor, instrument = np.divmod(np.asarray(ids, np.int64), n)
        return self.anchors[anchor], instrument

    def cut(
        self, tables: list[torch.Tensor], rows: torch.Tensor, subs: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs [batch, lookback, width] and targets [batch, targets]: one gather each
        (index_select over rows: about twice the rate of advanced indexing on a CPU)."""
        inputs, targets = tables
        key = str(rows.device)
        if key not in self._offsets:
            self._offsets[key] = torch.arange(1 - self.spec.lookback, 1, device=rows.device)
        window = rows[:, None] + self._offsets[key]  # [batch, lookback] time steps
        b, lookback = len(rows), self.spec.lookback
        if subs is None:
            x = inputs.view(len(inputs), -1).index_select(0, window.view(-1))
            return x.view(b, lookback, -1), targets.index_select(0, rows)
        n = self.num_instruments
        x = inputs.view(-1, inputs.shape[-1]).index_select(0, (window * n + subs[:, None]).view(-1))
        y = targets.view(-1).index_select(0, rows * n + subs)
        return x.view(b, lookback, -1), y.view(b, 1)


class TensorTables:
    """Your arrays (a Dataset's `tensors()`): a sample is row i of each; the batch is what
    torch's default_collate makes of the items (a list for tuple items, a dict for dicts)."""

    window_rows = 1
    rows_per_id = 1

    def __init__(self, arrays: Any, order: SampleOrder, first: int = 0, shared: dict | None = None):
        self.names = list(arrays) if isinstance(arrays, dict) else None
        values = list(arrays.values()) if isinstance(arrays, dict) else list(arrays)
        self.host = [as_tensor(v) for v in values]
        self.order = order
        self.first = first  # this split's first row (validation: the last fraction)
        self._on = {} if shared is None else shared  # device -> tables, shared by the splits

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.host)

    def host_tables(self) -> list[torch.Tensor]:
        return self.host

    def device_tables(self, device: torch.device) -> list[torch.Tensor]:
        if device.type == "cpu":
            return self.host
        if str(device) not in self._on:
            self._on[str(device)] = [t.to(device) for t in self.host]
        return self._on[str(device)]

    def keys(self, ids: np.ndarray) -> tuple[np.ndarray, None]:
        return self.first + np.asarray(ids, np.int64), None

    def cut(self, tables: list[torch.Tensor], rows: torch.Tensor, subs: None) -> Any:
        picked = [t.index_select(0, rows) for t in tables]
        return dict(zip(self.names, picked, strict=True)) if self.names else picked


def as_tensor(value: Any) -> torch.Tensor:
    """A tensor of an array or tensor (a read-only memory map is read, not copied)."""
    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    with warnings.catch_warnings():  # a read-only array: the tables are never written
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)
