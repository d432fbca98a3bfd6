"""Training data: byte-level text memmap, synthetic tokens, or a dataset of market series."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolkit.config.errors import below_minimum, not_one_of
from toolkit.config.model import ModelConfig, display_name, max_seq_len, supports, vocab_size
from toolkit.config.targets import IMPORT_PATH, TargetConfig, is_target_node, target_problems


@dataclass
class DataConfig:
    kind: str = "text"  # text | synthetic | returns
    # text: a UTF-8 file, tokenised as bytes. None: the built-in corpus (Python's own
    # documentation topics, generated once into cache_dir; no download).
    # returns: a dataset directory (`python -m toolkit.data prepare`). None: a synthetic
    # factor-model market written once into cache_dir (synthetic_* below).
    path: str | None = None
    seq_len: int = 128  # returns: the lookback window, in time steps
    val_fraction: float = 0.05
    cache_dir: str = "~/.cache/toolkit"
    prefetch: int = 2  # steps prepared ahead per worker (num_workers > 0)
    # The data order's seed (which samples, in which order, train and validation); None:
    # the job's seed. A run `seed=S data.order_seed=D` is the ensemble member of seed S whose
    # pack's data order is D (docs/ensembles.md, "What a member equals").
    order_seed: int | None = None
    # num_workers, pin_memory (below, with the returns settings) apply to every kind
    # --- returns only -----------------------------------------------------------------
    horizon: int = 1  # the target sums the target feature over this many steps ahead
    sample: str = "cross_section"  # cross_section (all instruments) | per_instrument
    features: list[str] = field(default_factory=list)  # inputs; empty: every feature
    target_feature: str = "ret"
    test_fraction: float = 0.0  # a held-out period after validation (never read in training)
    embargo: int | None = None  # time steps between periods; None: the horizon
    # Windows spanning a gap between consecutive time steps longer than this are not drawn
    # (overnight, weekend, halt): "auto" (10 median steps), "<k>x" (k median steps), a
    # duration ("90s", "30min", "16h", "3d"), a number in the time index's units (days for
    # dates, nanoseconds for timestamps), or None: every window (docs/data.md, "Gaps in time").
    max_gap: str | None = "auto"
    num_workers: int = 2  # loader processes, every kind (0: in the training process)
    pin_memory: bool = True  # page-locked batches, non-blocking copies (GPU only; every kind)
    shuffle_chunks: int = 8  # samples shuffle within groups of this many chunks (0: global)
    cache_mib: int = 256  # each worker's cache of decoded chunks
    verify: bool = True  # scan every file for NaNs outside the mask before training starts
    synthetic_format: str = "hdf5"  # hdf5 | parquet | npy (path: null)
    synthetic_times: int = 20_000
    synthetic_instruments: int = 16
    # --- where samples are cut (returns; docs/data.md, "Device-resident data") --------------
    placement: str = "auto"  # auto | device | host: windows cut on the training device or not
    device_budget_mib: int | None = None  # None: half the device's free memory (CPU: a share)

    KINDS = ("text", "synthetic", "returns")
    SAMPLES = ("cross_section", "per_instrument")
    FORMATS = ("hdf5", "parquet", "npy")
    SYNTHETIC_FEATURES = 3  # toolkit.data.synthetic.FEATURES


def order_seed(d: DataConfig | DatasetConfig, seed: int) -> int:
    """The data order's seed: data.order_seed, or the job's `seed` when it is None."""
    return seed if d.order_seed is None else d.order_seed


def seed_problems(d: DataConfig | DatasetConfig) -> list[str]:
    if d.order_seed is not None and d.order_seed < 0:
        return [f"data.order_seed={d.order_seed}: must be >= 0 (or null for the job's seed)"]
    return []


def effective_embargo(d: DataConfig) -> int:
    return d.horizon if d.embargo is None else d.embargo


@dataclass
class DatasetConfig(TargetConfig):
    """Your own torch Dataset (`data._target_`, toolkit.data.user): the toolkit's settings
    for it; every other key of the node is a keyword argument of the Dataset."""

    kind: ClassVar[str] = "dataset"  # not a field: a `_target_` node has no kind key
    seq_len: int = 128  # what the model sees per sample (FLOPs, tokens/s); not passed on
    collate_fn: str | None = None  # import path; None: torch's default_collate
    num_workers: int = 2  # loader processes (0: in the training process)
    prefetch: int = 2  # steps prepared ahead (per worker with num_workers > 0)
    pin_memory: bool = True  # page-locked batches and non-blocking copies (GPU only)
    shuffle: bool = True  # map-style: each epoch in its own order, seeded by (seed, epoch)
    # The data order's seed; None: the job's seed. The toolkit's key: not passed to your
    # Dataset (docs/ensembles.md, "What a member equals").
    order_seed: int | None = None
    drop_last: bool = False  # map-style: drop an epoch's last partial global batch
    val: Any = None  # a validation Dataset node ({_target_: ..., kwargs}), or None
    val_fraction: float = 0.0  # map-style, no `val`: the last fraction of items validates
    placement: str = "auto"  # auto | device | host; device needs tensors() (docs/data.md)
    device_budget_mib: int | None = None  # None: half the device's free memory (CPU: a share)


PLACEMENTS = ("auto", "device", "host")


def placement_problems(d: DataConfig | DatasetConfig) -> list[str]:
    """data.placement and data.device_budget_mib (docs/data.md, "Device-resident data")."""
    p = not_one_of("data", d, {"placement": PLACEMENTS})
    if d.device_budget_mib is not None and d.device_budget_mib < 1:
        p.append(
            f"data.device_budget_mib={d.device_budget_mib}: must be >= 1 (MiB), or null for "
            "half the device's free memory"
        )
    return p


def dataset_problems(d: DatasetConfig, model: ModelConfig) -> list[str]:
    p = target_problems("data", d) + placement_problems(d) + seed_problems(d)
    p += below_minimum("data", d, {"seq_len": 1, "num_workers": 0, "prefetch": 1})
    if d.collate_fn is not None and not IMPORT_PATH.fullmatch(d.collate_fn):
        p.append(f"data.collate_fn={d.collate_fn!r}: not an import path; use module.attribute")
    if d.val is not None and not is_target_node(d.val):
        p.append(f"data.val={d.val!r}: a Dataset node with _target_ (or null)")
    elif d.val is not None:
        p += target_problems("data.val", DatasetConfig(target=str(d.val["_target_"])))
    if not 0.0 <= d.val_fraction < 0.5:
        p.append(f"data.val_fraction={d.val_fraction}: must be in [0, 0.5)")
    if d.val is not None and d.val_fraction > 0:
        p.append("data.val_fraction: set with data.val; use one of them")
    limit = max_seq_len(model)
    if limit and d.seq_len > limit:
        p.append(f"data.seq_len={d.seq_len}: above model.max_seq_len={limit}")
    return p


def problems(d: DataConfig | DatasetConfig, model: ModelConfig) -> list[str]:
    """Problems with the data group and its fit to the model it feeds, one line each."""
    if isinstance(d, DatasetConfig):  # your own Dataset: its shape is the model's to check
        return dataset_problems(d, model)
    p = seed_problems(d)
    limit = max_seq_len(model)
    if limit and d.seq_len > limit:
        p.append(
            f"data.seq_len={d.seq_len}: above the model's maximum sequence length "
            f"(model.max_seq_len={limit}); use data.seq_len<={limit}"
        )
    p += below_minimum("data", d, {"seq_len": 2, "num_workers": 0, "prefetch": 0})
    if d.num_workers > 0 and d.prefetch < 1:
        p.append(f"data.prefetch={d.prefetch}: workers need >= 1 batch ahead; use data.prefetch>=1")
    if d.kind not in DataConfig.KINDS:
        p.append(f"data.kind={d.kind}: unknown; allowed: {', '.join(DataConfig.KINDS)}")
    can = supports(model)
    reads = can.reads if can is not None else "any"
    if reads == "tokens" and d.kind == "returns":
        p.append(
            f"data=returns: feeds real-valued series, and model {display_name(model)} reads "
            "tokens; use model=ts_transformer (or data=text)"
        )
    if reads == "series" and d.kind != "returns":
        p.append(f"data={d.kind}: model={display_name(model)} needs data=returns (it reads series)")
    vocab = vocab_size(model)
    if reads == "tokens" and d.kind in ("text", "synthetic") and vocab is not None and vocab < 256:
        p.append(f"model.vocab_size={vocab}: byte-level data needs >= 256")
    if not 0.0 < d.val_fraction < 0.5:
        p.append(f"data.val_fraction={d.val_fraction}: must be in (0, 0.5)")
    if d.kind == "returns":
        p += returns_problems(d, model) + placement_problems(d)
    return p


def returns_problems(d: DataConfig, model: ModelConfig) -> list[str]:
    p = below_minimum(
        "data",
        d,
        {
            "horizon": 1,
            "shuffle_chunks": 0,
            "cache_mib": 1,
            "synthetic_times": 64,
            "synthetic_instruments": 1,
        },
    )
    p += not_one_of(
        "data", d, {"sample": DataConfig.SAMPLES, "synthetic_format": DataConfig.FORMATS}
    )
    if not 0.0 <= d.test_fraction < 0.5:
        p.append(f"data.test_fraction={d.test_fraction}: must be in [0, 0.5)")
    p += max_gap_problems(d.max_gap)
    if d.embargo is not None and d.embargo < d.horizon:
        p.append(
            f"data.embargo={d.embargo}: below data.horizon={d.horizon}, so a training target "
            f"could overlap the validation period; use data.embargo>={d.horizon} (or null)"
        )
    series = getattr(model, "num_series", None)  # a model sized by its inputs
    if d.path is None and not d.features and series is not None:  # the synthetic market
        n, f = d.synthetic_instruments, DataConfig.SYNTHETIC_FEATURES
        width, targets = (n * f, n) if d.sample == "cross_section" else (f, 1)
        if model.num_series != width:
            p.append(
                f"model.num_series={model.num_series}: the synthetic market gives {width} "
                f"inputs per time step with data.sample={d.sample}; use model.num_series={width}"
            )
        if model.num_targets not in (0, targets) or (model.num_targets == 0 and width != targets):
            p.append(
                f"model.num_targets={model.num_targets}: data.sample={d.sample} has {targets} "
                f"targets per sample; use model.num_targets={targets}"
            )
    return p


MAX_GAP = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:x|s|min|h|d)?")


def max_gap_problems(value: str | None) -> list[str]:
    """data.max_gap: null, auto, a positive multiple of the median time step (`3x`), a
    positive duration (`90s`, `30min`, `16h`, `3d`) or number (the time index's units)."""
    if value is None or value == "auto":
        return []
    if not MAX_GAP.fullmatch(value) or float(value.rstrip("xsminhd")) <= 0:
        return [
            f"data.max_gap={value!r}: not a gap; use auto (10 median time steps), a multiple "
            "of the median step such as 3x, a duration such as 90s, 30min, 16h or 3d, a "
            "positive number in the time index's units (days for dates, nanoseconds for "
            "timestamps), or null for no limit"
        ]
    return []
