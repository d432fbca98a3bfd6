"""Samples that cannot leak: windows, time splits with an embargo, training-only statistics,
and the order samples are drawn in.

A sample is anchored at time step t: inputs are time steps [t - lookback + 1, t], the target
is the sum of the (normalised) target feature over (t, t + horizon]. It belongs to a split
only if *all* of those time steps lie inside the split's period, and periods are separated
by an embargo of at least the horizon:

    train [0, a)  | embargo | val [a + e, b) | embargo | test [b + e, T)

so no training sample's inputs or targets reach a validation or test time step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.data.manifest import DataError
from toolkit.data.moments import mean_std, period_moments

SPLITS = {"train": 0, "val": 1, "test": 2}
MODES = ("cross_section", "per_instrument")


@dataclass(frozen=True)
class SampleSpec:
    lookback: int
    horizon: int
    mode: str  # cross_section: all instruments of a time step; per_instrument: one
    target: int  # index of the target feature


@dataclass(frozen=True)
class Period:
    start: int  # first time step
    stop: int  # one past the last

    def anchors(self, spec: SampleSpec) -> range:
        """Anchor time steps whose whole sample (inputs and target) lies in the period."""
        return range(self.start + spec.lookback - 1, self.stop - spec.horizon)


def split_periods(
    num_times: int, val_fraction: float, test_fraction: float, embargo: int
) -> dict[str, Period]:
    """Train, validation and (when test_fraction > 0) test periods, in time order, an
    embargo apart."""
    num_test = round(num_times * test_fraction)
    num_val = round(num_times * val_fraction)
    out = {}
    stop = num_times
    if num_test:
        out["test"] = Period(stop - num_test, stop)
        stop -= num_test + embargo
    out["val"] = Period(stop - num_val, stop)
    out["train"] = Period(0, stop - num_val - embargo)
    return out


def check_periods(periods: dict[str, Period], spec: SampleSpec, where: str) -> None:
    for name, period in periods.items():
        if len(period.anchors(spec)) < 1:
            raise DataError(
                f"{where}: the {name} period has {max(0, period.stop - period.start)} time "
                f"steps, shorter than a window of lookback {spec.lookback} + horizon "
                f"{spec.horizon}; use a shorter data.seq_len or data.horizon, or a larger "
                f"split fraction"
            )


GAP_FACTOR = 10  # data.max_gap=auto: gaps longer than this many median time steps


DURATION_S = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}


def max_gap_of(value: str | None, times: np.ndarray, time_unit: str | None) -> float | None:
    """data.max_gap in the time index's units (toolkit.config.data.max_gap_problems says
    what is valid): None (no limit), "auto" (GAP_FACTOR median steps), "<k>x" (k median
    steps), a duration ("90s", "30min", "16h", "3d": needs the manifest's time_unit), or a
    number."""
    if value is None:
        return None
    if value == "auto" or value.endswith("x"):
        factor = GAP_FACTOR if value == "auto" else float(value[:-1])
        steps = np.diff(times)
        return factor * float(np.median(steps)) if len(steps) else None
    number = value.rstrip("smind").rstrip("h")
    if number == value:
        return float(value)
    seconds = float(number) * DURATION_S[value[len(number) :]]
    if time_unit is None:
        raise DataError(
            f"data.max_gap={value}: a duration, and this dataset's time index has no unit "
            "(integers as its source wrote them); give a number in those units, or a "
            "multiple of the median step such as 10x"
        )
    # Timestamps count whole nanoseconds: a limit of exactly 16 h keeps a 16 h gap.
    return float(round(seconds * 1e9)) if time_unit == "ns" else seconds / 86_400


def gap_free(anchors: range, times: np.ndarray, spec: SampleSpec, max_gap: float | None):
    """The anchors whose window (inputs and target, time steps [t - lookback + 1,
    t + horizon]) spans no gap between consecutive time steps longer than max_gap, as an
    int64 array (every anchor when max_gap is None). The sample order draws positions in
    this array, so the host and device loaders, and a resume, see the same anchors."""
    a = np.arange(anchors.start, anchors.stop, dtype=np.int64)
    if max_gap is None or len(a) == 0:
        return a
    wide = np.diff(times[: anchors.stop + spec.horizon]) > max_gap  # between t and t + 1
    before = np.concatenate([[0], np.cumsum(wide)])  # wide gaps among steps [0, j)
    return a[before[a + spec.horizon] == before[a - spec.lookback + 1]]


@dataclass
class Normalisation:
    """Per-feature mean and standard deviation over observed values of the training period
    only; saved with the run and in every checkpoint (the loader's state)."""

    features: list[str]
    mean: list[float]
    std: list[float]
    period: list[int]  # the time steps they were computed on: [start, stop)

    def as_dict(self) -> dict:
        return {
            "features": self.features,
            "mean": self.mean,
            "std": self.std,
            "period": self.period,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Normalisation:
        return cls(list(d["features"]), list(d["mean"]), list(d["std"]), list(d["period"]))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)


def fit_normalisation(reader, period: Period) -> Normalisation:
    """From the training period's time steps only (stored per-chunk moments inside it,
    reads at its ends: toolkit.data.moments)."""
    mean, std = mean_std(period_moments(reader, period.start, period.stop))
    std[std < 1e-8] = 1.0
    return Normalisation(
        list(reader.manifest.features), mean.tolist(), std.tolist(), [period.start, period.stop]
    )


def epoch_order(
    num_anchors: int, per_anchor: int, block: int, group: int, rng: np.random.Generator
) -> np.ndarray:
    """A permutation of the epoch's sample ids (anchor index * per_anchor + instrument) that
    keeps reads local: anchors in blocks of `block` (one chunk), blocks shuffled, then samples
    shuffled within groups of `group` consecutive blocks. A step's batch thus touches a few
    chunks, each read once, instead of one chunk per sample. group=0: one global shuffle."""
    if group <= 0:
        return rng.permutation(num_anchors * per_anchor)
    num_blocks = math.ceil(num_anchors / block)
    blocks = rng.permutation(num_blocks)
    out = []
    for g in range(0, num_blocks, group):
        anchors = np.concatenate(
            [np.arange(b * block, min((b + 1) * block, num_anchors)) for b in blocks[g : g + group]]
        )
        ids = (anchors[:, None] * per_anchor + np.arange(per_anchor)[None, :]).ravel()
        out.append(rng.permutation(ids))
    return np.concatenate(out)


@dataclass
class SampleOrder:
    """Sample ids of any range of positions in the endless sequence of epochs; epoch e's
    order depends on (seed, split, e) only, never on workers or ranks."""

    seed: int
    split: str
    num_anchors: int
    per_anchor: int
    block: int
    group: int

    def __post_init__(self) -> None:
        self._cache: dict[int, np.ndarray] = {}

    @property
    def epoch_len(self) -> int:
        return self.num_anchors * self.per_anchor

    def epoch(self, e: int) -> np.ndarray:
        if e not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            rng = np.random.default_rng([self.seed, SPLITS[self.split], e])
            self._cache[e] = epoch_order(
                self.num_anchors, self.per_anchor, self.block, self.group, rng
            )
        return self._cache[e]

    def ids(self, lo: int, hi: int) -> np.ndarray:
        """Sample ids at positions [lo, hi)."""
        n = self.epoch_len
        out = []
        pos = lo
        while pos < hi:
            e, off = divmod(pos, n)
            take = min(hi - pos, n - off)
            out.append(self.epoch(e)[off : off + take])
            pos += take
        return np.concatenate(out) if out else np.zeros(0, np.int64)
