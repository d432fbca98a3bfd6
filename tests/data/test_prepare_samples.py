"""`toolkit.data prepare` keeps a timestamp's time of day, refuses what its shape cannot
tell apart, and points pre-windowed samples at the Dataset that trains on them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.shape import BatchShape
from toolkit.data.__main__ import main
from toolkit.data.manifest import DataError
from toolkit.data.prepare import prepare
from toolkit.data.reader import DatasetReader
from toolkit.data.user import build_loaders


def test_minute_bars_keep_their_time_of_day(tmp_path):
    stamps = np.array(
        ["2026-12-01T09:30", "2026-12-01T09:31", "2026-12-01T09:32"], "datetime64[ns]"
    )
    table = pa.table(
        {
            "time": pa.array(np.repeat(stamps, 2)),
            "instrument": ["A", "B"] * 3,
            "ret": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
        }
    )
    pq.write_table(table, tmp_path / "bars.parquet")
    m = prepare(tmp_path / "bars.parquet", tmp_path / "out")
    assert m.shape == [3, 2, 1]  # three bars, not one day holding three pairs
    reader = DatasetReader(tmp_path / "out")
    assert np.array_equal(reader.times, stamps.astype(np.int64))  # nanoseconds since 1970
    values, _ = reader.window(0, 3)
    assert np.allclose(values[:, 1, 0], [0.2, 0.4, 0.6])


def test_dates_stay_days_since_1970(tmp_path):
    table = pa.table(
        {
            "time": pa.array(np.array(["2026-12-01", "2026-12-02"], "datetime64[D]")),
            "instrument": ["A", "A"],
            "ret": [1.0, 2.0],
        }
    )
    pq.write_table(table, tmp_path / "daily.parquet")
    prepare(tmp_path / "daily.parquet", tmp_path / "out")
    days = (np.datetime64("2026-12-01") - np.datetime64("1970-01-01")).astype(int)
    assert list(DatasetReader(tmp_path / "out").times) == [days, days + 1]


def test_a_3d_npy_is_refused_unless_its_layout_is_named(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros((20, 4, 3), np.float32))
    with pytest.raises(DataError, match=r"may be series \[time, instrument, feature\] or samples"):
        prepare(tmp_path / "a.npy", tmp_path / "out")
    assert main(["prepare", str(tmp_path / "a.npy"), str(tmp_path / "out")]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1  # one line
    assert (
        main(["prepare", str(tmp_path / "a.npy"), str(tmp_path / "out"), "--layout", "series"]) == 0
    )
    assert read_shape(tmp_path / "out") == [20, 4, 3]


def read_shape(root):
    from toolkit.data.manifest import read_manifest

    return read_manifest(root).shape


def samples_npz(path, n=24, steps=8, width=3):
    rng = np.random.default_rng(0)
    np.savez(
        path, X=rng.standard_normal((n, steps, width)).astype(np.float32), y=rng.standard_normal(n)
    )
    return path


def test_an_npz_of_samples_is_pointed_at_windowed_samples(tmp_path):
    with pytest.raises(DataError, match="data._target_=toolkit.data.WindowedSamples"):
        prepare(samples_npz(tmp_path / "s.npz"), tmp_path / "out")


def test_windowed_samples_train_through_the_user_dataset_loader(tmp_path):
    path = samples_npz(tmp_path / "s.npz")
    job = to_job(
        compose_raw(
            [
                "model=ts_transformer",
                "model.num_series=3",
                "model.num_targets=1",
                "data=dataset",
                "data._target_=toolkit.data.WindowedSamples",
                f"+data.path={path}",
                "+data.seq_len=8",
                "+data.num_workers=0",
                "+data.val_fraction=0.25",
            ]
        )
    )
    plan = BatchShape(seed=0, seq_len=8, micro_batch_size=4, grad_accum=1, world_size=1, rank=0)
    train, val = build_loaders(job.data, plan, False)
    step, [(x, y)] = next(train)
    assert step == 0 and x.shape == (4, 8, 3) and y.shape == (4, 1) and x.dtype == torch.float32
    assert len(train.dataset) == 18 and len(val.dataset) == 6
    with np.load(path) as z:  # the first validation item is sample 18 of the file
        assert np.allclose(val.dataset[0][0].numpy(), z["X"][18])
