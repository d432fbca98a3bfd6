"""A dataset manifest is confined to its directory and agrees with itself, and prepare
refuses an infinite value (or marks it missing when asked): each refusal is one line that
names the manifest or the source and what to do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.data.conftest import config
from toolkit.data.__main__ import main as data_cli
from toolkit.data.manifest import MANIFEST, DataError, read_manifest
from toolkit.data.reader import DatasetReader
from toolkit.data.synthetic import write_synthetic
from toolkit.data.training import prepare

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "market"
    write_synthetic(root, 600, 4, "npy", chunk_len=32)
    return root


def edit_manifest(root: Path, edit) -> None:
    manifest = json.loads((root / MANIFEST).read_text())
    edit(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest))


def refused(root: Path, match: str) -> str:
    with pytest.raises(DataError, match=match) as caught:
        prepare(config(root), 12, 4)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize(
    "path", ["../outside.npy", "/etc/passwd", "sub/../../outside.npy"], ids=["dotdot", "abs", "sub"]
)
def test_a_part_path_outside_the_dataset_is_refused(dataset, path) -> None:
    (dataset.parent / "outside.npy").write_bytes((dataset / "part-00000.values.npy").read_bytes())
    edit_manifest(dataset, lambda m: m["parts"][0].update(path=path))
    message = refused(dataset, "a path outside the dataset directory; refused")
    assert str(dataset / MANIFEST) in message


def test_a_part_that_is_a_symlink_out_of_the_dataset_is_refused(dataset) -> None:
    outside = dataset.parent / "elsewhere.npy"
    (dataset / "part-00000.values.npy").rename(outside)
    (dataset / "part-00000.values.npy").symlink_to(outside)
    message = refused(dataset, "'part-00000.values.npy', a symlink leading out of")
    assert str(dataset / MANIFEST) in message


def test_moments_outside_the_dataset_are_never_opened_by_inspect(dataset, capsys) -> None:
    edit_manifest(dataset, lambda m: m.update(moments="../../../../etc/passwd"))
    assert data_cli(["inspect", str(dataset)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "lists '../../../../etc/passwd', a path outside the dataset directory" in line


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: m.update(features=m["features"][:2]), "2 feature names for a shape of 3"),
        (lambda m: m["parts"][-1].update(time_stop=700), r"\[512, 700\), outside the shape's 600"),
        (lambda m: m["parts"][0].update(time_start=-1), r"\[-1, 256\)"),
        (lambda m: m.update(dtype="object"), "dtype 'object' is not a numeric type"),
        (lambda m: m.update(dtype="U8"), "dtype 'U8' is not a numeric type"),
        (lambda m: m.update(instruments=["A"]), "1 instruments for a shape of 4"),
    ],
    ids=["features", "time-stop", "time-start", "object", "string", "instruments"],
)
def test_a_manifest_that_disagrees_with_itself_is_refused(dataset, edit, says) -> None:
    edit_manifest(dataset, edit)
    message = refused(dataset, says)
    assert message.endswith("prepare the dataset again")


def test_prepare_refuses_an_infinite_value_in_one_line(tmp_path, capsys) -> None:
    values = np.random.default_rng(0).normal(size=(40, 3, 2)).astype(np.float32)
    values[7, 1, 0] = np.inf
    values[9, 2, 1] = -np.inf
    np.save(tmp_path / "src.npy", values)
    assert (
        data_cli(
            ["prepare", str(tmp_path / "src.npy"), str(tmp_path / "out"), "--layout", "series"]
        )
        == 1
    )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "2 infinite value(s), the first at time row 7, instrument 1, feature 0" in line
    assert "--nonfinite=mask" in line and not (tmp_path / "out").exists()

    # Asked to, prepare marks them missing: the dataset holds only finite observed values.
    out = tmp_path / "masked"
    assert (
        data_cli(
            [
                "prepare",
                str(tmp_path / "src.npy"),
                str(out),
                "--nonfinite=mask",
                "--layout",
                "series",
            ]
        )
        == 0
    )
    reader = DatasetReader(out)
    got, mask = reader.window(0, 40)
    assert not mask[7, 1, 0] and not mask[9, 2, 1] and mask.sum() == values.size - 2
    assert np.isfinite(got[mask.astype(bool)]).all()
    assert read_manifest(out).shape == [40, 3, 2]


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ("1,A,0.1\n1,,0.2\n2,A,0.3\n", "1 row(s) with no 'instrument' (null or empty), the first is data row 2"),
        ("1,A,0.1\n,B,0.2\n,A,0.3\n", "2 row(s) with no 'time' (null or empty), the first is data row 2"),
    ],
)  # fmt: skip
def test_prepare_refuses_a_row_without_its_time_or_instrument_in_one_line(
    tmp_path, capsys, rows, says
) -> None:
    (tmp_path / "src.csv").write_text("time,instrument,ret\n" + rows)
    assert data_cli(["prepare", str(tmp_path / "src.csv"), str(tmp_path / "out")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: {tmp_path / 'src.csv'}: {says}; fill them in or drop those rows"
    assert not (tmp_path / "out").exists()


def test_prepare_refuses_a_null_instrument_id_in_parquet_and_a_source_without_features(
    tmp_path, capsys
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"time": [1, 1, 2], "instrument": ["A", None, "A"], "ret": [0.1, 0.2, 0.3]})
    pq.write_table(table, tmp_path / "src.parquet")
    assert data_cli(["prepare", str(tmp_path / "src.parquet"), str(tmp_path / "out")]) == 1
    assert "1 row(s) with no 'instrument'" in capsys.readouterr().err
    pq.write_table(table.drop_columns(["ret"]), tmp_path / "keys.parquet")
    assert data_cli(["prepare", str(tmp_path / "keys.parquet"), str(tmp_path / "out")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(
        "keys.parquet: no feature column, only 'time' and 'instrument'; add at least one "
        "column of numbers (one per feature)"
    )


def test_nothing_in_the_repository_unpickles_numpy_files() -> None:
    pattern = re.compile(r"allow_pickle\s*=\s*True")
    offenders = [
        str(p.relative_to(REPO))
        for folder in ("toolkit", "scripts", "jobs", "benchmarks")
        if (REPO / folder).is_dir()
        for p in (REPO / folder).rglob("*.py")
        if pattern.search(p.read_text(errors="replace"))
    ]
    assert offenders == []


def test_prepare_names_a_feature_column_of_strings(tmp_path, capsys) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {"time": [1, 1, 2], "instrument": ["A", "B", "A"], "sector": ["tech", "bank", "x"]}
    )
    pq.write_table(table, tmp_path / "src.parquet")
    assert data_cli(["prepare", str(tmp_path / "src.parquet"), str(tmp_path / "out")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "feature column 'sector' holds string, not numbers" in line
