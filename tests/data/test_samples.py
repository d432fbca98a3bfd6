"""Samples cannot leak: time splits an embargo apart, training-only statistics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.data.conftest import config
from toolkit.data.loader import SamplePlan, build_loaders
from toolkit.data.reader import DatasetReader
from toolkit.data.samples import SampleSpec, fit_normalisation, split_periods
from toolkit.data.synthetic import write_synthetic

PLAN = SamplePlan(seed=5, seq_len=16, micro_batch_size=8, grad_accum=1, world_size=1, rank=0)


def test_periods_are_in_time_order_an_embargo_apart() -> None:
    p = split_periods(1000, val_fraction=0.2, test_fraction=0.1, embargo=5)
    assert p["test"].start - p["val"].stop == 5 and p["val"].start - p["train"].stop == 5
    assert p["train"].start == 0 and p["test"].stop == 1000


@pytest.mark.parametrize("mode", ["cross_section", "per_instrument"])
def test_no_training_sample_reaches_a_validation_target(mode) -> None:
    """Every time step any training sample reads (inputs and target) lies before every
    time step any validation target covers, at least an embargo earlier."""
    spec = SampleSpec(lookback=16, horizon=3, mode=mode, target=0)
    p = split_periods(1000, 0.2, 0.1, embargo=3)
    train_seen = {s for t in p["train"].anchors(spec) for s in range(t - 15, t + 4)}
    val_targets = {s for t in p["val"].anchors(spec) for s in range(t + 1, t + 4)}
    test_seen = {s for t in p["test"].anchors(spec) for s in range(t - 15, t + 4)}
    assert train_seen and val_targets
    assert not train_seen & val_targets and not train_seen & test_seen
    assert min(val_targets) - max(train_seen) > 3


@pytest.mark.parametrize("mode", ["cross_section", "per_instrument"])
def test_poisoned_validation_data_never_reaches_a_training_batch(tmp_path, mode) -> None:
    """The same market twice, the second with every value from the validation period on
    replaced by 1e6: a whole epoch of training batches is identical in both, and so are the
    normalisation statistics."""
    clean, poisoned = tmp_path / "clean", tmp_path / "poisoned"
    write_synthetic(clean, 600, 4, "npy", chunk_len=32)
    write_synthetic(poisoned, 600, 4, "npy", chunk_len=32)
    cfg = config(clean, sample=mode, horizon=3, test_fraction=0.0, shuffle_chunks=0)
    model_shape = (12, 4) if mode == "cross_section" else (3, 1)  # inputs, targets
    train, val = build_loaders(cfg, PLAN, *model_shape, False)
    first_val = val.windows.anchors[0] - cfg.seq_len + 1
    assert first_val - (train.windows.anchors[-1] + cfg.horizon) > cfg.horizon
    for part in sorted(poisoned.glob("*.values.npy")):
        values = np.load(part, mmap_mode="r+")
        start = int(part.name.split("-")[1].split(".")[0]) * 32 * 8
        values[max(0, first_val - start) :] = 1e6
        values.flush()
    cfg_p = dataclasses.replace(cfg, path=str(poisoned))
    train_p, val_p = build_loaders(cfg_p, PLAN, *model_shape, False)
    assert train_p.windows.norm == train.windows.norm
    steps = train.windows.order.epoch_len // PLAN.global_batch_size + 1
    for _ in range(steps):
        (_, [(x, y)]), (_, [(xp, yp)]) = next(train), next(train_p)
        assert torch.equal(x, xp) and torch.equal(y.nan_to_num(), yp.nan_to_num())
    x, _ = val_p.batch(0)[0]
    assert x.abs().max() > 1e3  # the poison is there, only in validation


def test_normalisation_uses_the_training_period_only(datasets) -> None:
    reader = DatasetReader(datasets["npy"])
    p = split_periods(1200, 0.2, 0.1, 2)
    norm = fit_normalisation(reader, p["train"])
    v, m = reader.window(0, p["train"].stop)
    assert norm.mean[0] == pytest.approx(float(v[..., 0][m[..., 0]].mean()), rel=1e-4)
    assert norm.period == [0, p["train"].stop]


def test_normalisation_is_saved_with_the_run_and_the_loader_state(datasets, tmp_path) -> None:
    import json

    train, _ = build_loaders(config(datasets["hdf5"]), PLAN, 18, 6, False, run_dir=tmp_path)
    saved = json.loads((tmp_path / "data_normalisation.json").read_text())
    assert saved == train.state_dict()["normalisation"]
    assert saved["features"] == ["ret", "signal", "volume"]


def test_per_instrument_validation_comes_in_whole_time_steps(datasets) -> None:
    """Validation rows come in groups of every instrument of one time step, so the IC is
    taken per time step; training samples stay one instrument each, shuffled."""
    cfg = config(datasets["npy"], sample="per_instrument")
    train, val = build_loaders(cfg, PLAN, 3, 1, False)
    x, y = val.batch(0)[0]
    assert x.shape == (8 * 6, 16, 3) and y.shape == (8 * 6, 1)
    reader = val.windows.reader
    anchor = val.windows.anchors[int(val.windows.order.ids(0, 1)[0])]
    values, mask = reader.window(anchor - 15, anchor + 1)
    mean, std = val.windows.norm.arrays()
    want = np.where(mask, (values - mean) / std, 0.0).transpose(1, 0, 2)
    assert np.allclose(x[:6].numpy(), want, atol=1e-5)
    assert next(train)[1][0][0].shape == (8, 16, 3)


def test_rank_ic_is_one_for_a_perfect_ranking_and_groups_rows_by_time_step() -> None:
    from toolkit.train.metrics import rank_ic

    target = torch.tensor([[0.1, 0.5, -0.2, float("nan")], [1.0, 2.0, 3.0, 4.0]])
    total, rows = rank_ic(target.nan_to_num() * 3 + 1, target)
    assert rows == 2 and total == pytest.approx(2.0)
    total, rows = rank_ic(-target.reshape(-1, 1), target.reshape(-1, 1), group=4)
    assert rows == 2 and total == pytest.approx(-2.0)


@pytest.mark.parametrize(("start", "stop"), [(0, 1200), (0, 837), (10, 20), (65, 1000), (64, 128)])
def test_stored_chunk_moments_give_the_statistics_of_any_period(datasets, start, stop) -> None:
    from toolkit.data.moments import chunk_moments, period_moments

    reader = DatasetReader(datasets["parquet"])
    assert reader.moments is not None
    v, m = reader.window(start, stop)
    assert np.allclose(period_moments(reader, start, stop), chunk_moments(v, m), rtol=1e-9)
