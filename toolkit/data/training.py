"""What training needs of a dataset, checked before any rank starts (numpy only, no torch:
the launcher imports this on every launch).

Every problem is a DataError with one line naming the file or field and what to do: a
missing or truncated file, a feature name not in the manifest, NaN or inf where the mask
says observed, a window longer than a split's period, a model whose width does not fit the
samples.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.config.data import DataConfig, effective_embargo
from toolkit.data.manifest import MANIFEST, DataError
from toolkit.data.reader import DatasetReader
from toolkit.data.samples import (
    Period,
    SampleSpec,
    check_periods,
    gap_free,
    max_gap_of,
    split_periods,
)
from toolkit.data.synthetic import cached_synthetic

log = logging.getLogger(__name__)


@dataclass
class Opened:
    reader: DatasetReader
    spec: SampleSpec
    periods: dict[str, Period]
    features: list[int]  # indices of the input features
    # Each split's anchor time steps: its period's, less those whose window spans a gap
    # longer than data.max_gap (toolkit.data.samples.gap_free).
    anchors: dict[str, np.ndarray]

    @property
    def num_inputs(self) -> int:
        n = self.reader.manifest.shape[1]
        return len(self.features) * (n if self.spec.mode == "cross_section" else 1)

    @property
    def num_targets(self) -> int:
        return self.reader.manifest.shape[1] if self.spec.mode == "cross_section" else 1


def dataset_path(cfg: DataConfig) -> Path:
    if cfg.path:
        return Path(cfg.path).expanduser()
    return cached_synthetic(
        cfg.cache_dir, cfg.synthetic_times, cfg.synthetic_instruments, cfg.synthetic_format
    )


def open_dataset(cfg: DataConfig, num_series: int, num_targets: int = 0) -> Opened:
    root = dataset_path(cfg)
    reader = DatasetReader(root, cache_bytes=cfg.cache_mib << 20)
    m = reader.manifest
    names = cfg.features or m.features
    unknown = [f for f in [*names, cfg.target_feature] if f not in m.features]
    if unknown:
        raise DataError(
            f"{root / MANIFEST}: feature {unknown[0]!r} (data.features/data.target_feature) is "
            f"not in the dataset; it has: {', '.join(m.features)}"
        )
    spec = SampleSpec(cfg.seq_len, cfg.horizon, cfg.sample, m.features.index(cfg.target_feature))
    periods = split_periods(
        m.num_times, cfg.val_fraction, cfg.test_fraction, effective_embargo(cfg)
    )
    check_periods(periods, spec, f"{root / MANIFEST} ({m.num_times} time steps)")
    anchors = split_anchors(cfg, reader.times, m.time_unit, spec, periods)
    opened = Opened(reader, spec, periods, [m.features.index(f) for f in names], anchors)
    if not num_series:  # a model of yours, not sized by the data: nothing to check here
        return opened
    if num_series != opened.num_inputs:
        raise DataError(
            f"model.num_series={num_series}: {root} gives {opened.num_inputs} inputs per time "
            f"step with data.sample={cfg.sample}; use model.num_series={opened.num_inputs}"
        )
    if (num_targets or num_series) != opened.num_targets:
        raise DataError(
            f"model.num_targets={num_targets}: data.sample={cfg.sample} has "
            f"{opened.num_targets} targets per sample; use model.num_targets={opened.num_targets}"
        )
    return opened


def split_anchors(
    cfg: DataConfig,
    times: np.ndarray,
    time_unit: str | None,
    spec: SampleSpec,
    periods: dict[str, Period],
) -> dict[str, np.ndarray]:
    """Each split's anchors without the windows that span a gap longer than data.max_gap;
    a split left with none is one line."""
    max_gap = max_gap_of(cfg.max_gap, times, time_unit)
    out = {name: gap_free(p.anchors(spec), times, spec, max_gap) for name, p in periods.items()}
    for name, anchors in out.items():
        if len(anchors) == 0:
            raise DataError(
                f"data.max_gap={cfg.max_gap}: every window of the {name} period (lookback "
                f"{spec.lookback} + horizon {spec.horizon} time steps) spans a gap between "
                f"time steps longer than {max_gap:g} {time_unit or 'time index units'}; raise "
                "data.max_gap, or set it to null to draw every window"
            )
    return out


def verify(reader: DatasetReader) -> None:
    """Reads every chunk once: damaged files and NaN or inf where the mask says observed
    fail here, not at some step hours into training."""
    for _ in reader.iter_chunks():
        pass
    if len(reader.times) > 1 and not (np.diff(reader.times) > 0).all():
        raise DataError(f"{reader.root}: the time index is not strictly increasing")


def prepare(cfg: DataConfig, num_series: int, num_targets: int = 0) -> Path:
    """The launcher's step: generate the synthetic market if needed, then check everything."""
    opened = open_dataset(cfg, num_series, num_targets)
    for name, period in opened.periods.items():
        left_out = len(period.anchors(opened.spec)) - len(opened.anchors[name])
        if left_out:
            log.info(
                "data: %d of %d %s windows span a gap in time longer than data.max_gap=%s; "
                'not drawn (docs/data.md, "Gaps in time")',
                left_out,
                len(period.anchors(opened.spec)),
                name,
                cfg.max_gap,
            )
    if cfg.verify:
        verify(opened.reader)
    opened.reader.close()
    return opened.reader.root
