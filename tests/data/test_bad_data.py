"""Bad data fails before training starts, in one line naming the file and what to do."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from tests.conftest import launch
from tests.data.conftest import config
from toolkit.config.data import DataConfig, problems
from toolkit.config.model import TimeSeriesConfig
from toolkit.data import writer
from toolkit.data.__main__ import main as data_main
from toolkit.data.inspect import summary
from toolkit.data.manifest import DataError
from toolkit.data.synthetic import write_synthetic
from toolkit.data.training import open_dataset, prepare

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "market"
    write_synthetic(root, 600, 4, "npy", chunk_len=32)
    return root


def check(cfg: DataConfig, match: str) -> str:
    with pytest.raises(DataError, match=match) as caught:
        prepare(cfg, 12, 4)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_file_is_named(dataset) -> None:
    (dataset / "part-00001.values.npy").unlink()
    message = check(config(dataset), "missing")
    assert "part-00001.values.npy" in message and "prepare the dataset again" in message


def test_a_truncated_file_is_named(dataset) -> None:
    path = dataset / "part-00000.values.npy"
    path.write_bytes(path.read_bytes()[:-100])
    message = check(config(dataset), "the manifest says")
    assert "part-00000.values.npy" in message and "truncated" in message


def test_a_missing_manifest_says_how_to_make_one(tmp_path) -> None:
    check(config(tmp_path), "no manifest; write the dataset with `python -m toolkit.data")


def test_a_feature_not_in_the_manifest_is_named(dataset) -> None:
    message = check(config(dataset, target_feature="close"), "feature 'close'")
    assert "it has: ret, signal, volume" in message
    check(config(dataset, features=["ret", "vwap"]), "feature 'vwap'")


def test_nans_outside_the_mask_are_found_before_training(dataset) -> None:
    values = np.load(dataset / "part-00001.values.npy", mmap_mode="r+")
    mask = np.load(dataset / "part-00001.mask.npy")
    t, i, f = np.argwhere(mask)[40]
    values[t, i, f] = np.nan
    values.flush()
    message = check(config(dataset), "NaN at row")
    assert "part-00001.values.npy" in message and "set the mask to 0" in message


def plant(dataset, value: float) -> tuple[int, int, int]:
    """Writes `value` into an observed cell of part 1 (as a tool editing the file would)."""
    values = np.load(dataset / "part-00001.values.npy", mmap_mode="r+")
    mask = np.load(dataset / "part-00001.mask.npy")
    t, i, f = (int(x) for x in np.argwhere(mask)[40])
    values[t, i, f] = value
    values.flush()
    return t, i, f


@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_an_infinite_value_is_refused_like_a_nan(dataset, value) -> None:
    t, i, f = plant(dataset, value)
    message = check(config(dataset), re.escape(f"{value:+} at row {t} "))
    assert "part-00001.values.npy" in message and f"instrument {i}, feature {f}" in message
    # also with data.verify=false: the loader's read refuses it before any step uses it
    reader = open_dataset(config(dataset, verify=False), 12, 4).reader
    with pytest.raises(DataError, match="inf at row"):
        reader.window(0, reader.manifest.num_times)


def test_inspect_warns_about_an_infinite_value_and_leaves_it_out(dataset, capsys) -> None:
    clean = summary(dataset)["features"]
    t, i, f = plant(dataset, np.inf)
    assert data_main(["inspect", str(dataset)]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, out
    assert "1 NaN/inf value(s) where the mask says observed (1 in" in warnings[0]
    assert f"part-00001.values.npy at row {t}, instrument {i}" in warnings[0]
    assert "training refuses this dataset" in warnings[0]
    name = list(clean)[f]
    stats = summary(dataset)["features"][name]
    assert stats["nonfinite"] == 1 and np.isfinite([stats["mean"], stats["std"]]).all()
    assert stats["missing"] == pytest.approx(clean[name]["missing"])


def test_a_window_longer_than_the_data_is_refused(dataset) -> None:
    message = check(config(dataset, seq_len=200), "shorter than a window")
    assert "lookback 200 + horizon 2" in message and "data.seq_len" in message


def test_a_model_that_does_not_fit_the_samples_is_named(dataset) -> None:
    with pytest.raises(DataError, match="use model.num_series=12"):
        prepare(config(dataset), 10, 4)


def test_prepare_leaves_nothing_half_written(tmp_path, monkeypatch) -> None:
    real = writer.write_part
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "write_part", failing)
    with pytest.raises(OSError, match="disk full"):
        write_synthetic(tmp_path / "out", 600, 4, "hdf5", chunk_len=32)
    assert list(tmp_path.iterdir()) == []


def test_an_embargo_shorter_than_the_horizon_is_a_config_problem() -> None:
    model = TimeSeriesConfig(num_series=48, num_targets=16)
    found = problems(DataConfig(kind="returns", seq_len=64, horizon=5, embargo=2), model)
    assert found == [
        "data.embargo=2: below data.horizon=5, so a training target could overlap the "
        "validation period; use data.embargo>=5 (or null)"
    ]


@pytest.mark.slow
def test_the_launcher_refuses_a_bad_dataset_in_one_line(dataset, tmp_path) -> None:
    shutil.copy(dataset / "part-00000.mask.npy", dataset / "part-00001.mask.npy")
    (dataset / "part-00002.values.npy").unlink()
    done = launch(
        "experiment=returns",
        f"data.path={dataset}",
        "data.synthetic_instruments=4",
        "model.num_series=12",
        "model.num_targets=4",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "part-00002.values.npy: missing" in lines[0], done.stderr
    assert not (tmp_path / "run").exists()  # nothing started
