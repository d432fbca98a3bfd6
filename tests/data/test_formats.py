"""Round trips: source files -> prepare -> inspect -> load, for every format."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.data.__main__ import main
from toolkit.data.inspect import summary
from toolkit.data.manifest import DataError, read_manifest
from toolkit.data.prepare import prepare
from toolkit.data.reader import DatasetReader
from toolkit.data.synthetic import generate

FORMATS = ("hdf5", "parquet", "npy")


@pytest.fixture(scope="module")
def source():
    values, mask, times = generate(300, 4, seed=3)
    return values, mask.astype(bool), times


def _same(root, source) -> None:
    values, mask, times = source
    reader = DatasetReader(root)
    got_v, got_m = reader.window(0, len(times))
    assert np.array_equal(got_m, mask)
    assert np.array_equal(got_v[mask], values[mask])
    assert np.isnan(got_v[~mask]).all()
    assert np.array_equal(reader.times, times)
    v, m = reader.window(37, 201)  # across chunk and part boundaries
    assert np.array_equal(m, mask[37:201]) and np.array_equal(v[m], values[37:201][m])


@pytest.mark.parametrize("fmt", FORMATS)
def test_numpy_source_round_trips_through_every_format(tmp_path, source, fmt) -> None:
    values, mask, times = source
    src = tmp_path / "src.npz"
    features = np.array(["ret", "signal", "volume"])
    np.savez(src, values=values, mask=mask, times=times, features=features)
    m = prepare(src, tmp_path / "out", fmt, chunk_len=16)
    assert m.shape == [300, 4, 3] and m.chunk == [16, 4, 3] and len(m.parts) == 3
    _same(tmp_path / "out", source)


@pytest.mark.parametrize("fmt", FORMATS)
def test_csv_and_parquet_sources_round_trip(tmp_path, source, fmt) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    values, mask, times = source
    t_idx, i_idx = np.meshgrid(np.arange(len(times)), np.arange(4), indexing="ij")
    columns = {
        "time": pa.array(times[t_idx.ravel()]),
        "instrument": pa.array([f"I{i}" for i in i_idx.ravel()]),
    }
    for j, name in enumerate(("ret", "signal", "volume")):
        columns[name] = pa.array(values[..., j].ravel(), mask=~mask[..., j].ravel())
    table = pa.table(columns)
    (tmp_path / "by_date").mkdir()
    half = table.num_rows // 2  # two files, as a date-partitioned source would have
    pq.write_table(table.slice(0, half), tmp_path / "by_date" / "a.parquet")
    pq.write_table(table.slice(half), tmp_path / "by_date" / "b.parquet")
    pcsv.write_csv(table, tmp_path / "all.csv")
    for name, src in (("pq", tmp_path / "by_date"), ("csv", tmp_path / "all.csv")):
        out = tmp_path / f"{name}-{fmt}"
        prepare(src, out, fmt, chunk_len=32)
        _same(out, source)
        assert read_manifest(out).instruments == ["I0", "I1", "I2", "I3"]


def test_date_partitions_convert_one_file_at_a_time(tmp_path, source, monkeypatch) -> None:
    """A source split by date into files that do not overlap in time is pivoted and written
    one file at a time (memory: one file and one part); overlapping files are read at once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from toolkit.data import writer

    values, mask, times = source
    appended = []
    real = writer.DatasetWriter.append

    def counted(self, v, m):
        appended.append(len(v))
        return real(self, v, m)

    monkeypatch.setattr(writer.DatasetWriter, "append", counted)
    (tmp_path / "days").mkdir()
    for k, lo in enumerate(range(0, 300, 100)):  # written out of order on purpose
        t_idx, i_idx = np.meshgrid(np.arange(lo, lo + 100), np.arange(4), indexing="ij")
        columns = {"time": pa.array(times[t_idx.ravel()]), "instrument": pa.array(i_idx.ravel())}
        for j, name in enumerate(("ret", "signal", "volume")):
            columns[name] = pa.array(
                values[t_idx, i_idx, j].ravel(), mask=~mask[t_idx, i_idx, j].ravel()
            )
        pq.write_table(pa.table(columns), tmp_path / "days" / f"{2 - k}.parquet")
    prepare(tmp_path / "days", tmp_path / "out", "hdf5", chunk_len=16)
    assert appended == [100, 100, 100]
    _same(tmp_path / "out", source)
    appended.clear()
    pq.write_table(
        pq.read_table(tmp_path / "days" / "0.parquet").slice(0, 4), tmp_path / "days" / "3.parquet"
    )
    with pytest.raises(DataError) as caught:  # the first repeated pair, by time and file rows
        prepare(tmp_path / "days", tmp_path / "out2", "hdf5", chunk_len=16)
    assert str(caught.value) == (
        f"{tmp_path / 'days'}: 4 duplicate (time, instrument) row(s), the first is time "
        f"{times[200]}, instrument '0' at data rows 1 of 0.parquet, 1 of 3.parquet; keep one "
        "row per time and instrument"
    )
    assert appended == [] and not (tmp_path / "out2").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_inspect_reports_shapes_missing_fraction_and_statistics(datasets, capsys, fmt) -> None:
    s = summary(datasets[fmt])
    reader = DatasetReader(datasets[fmt])
    v, m = reader.window(0, reader.manifest.num_times)
    ret = v[..., 0][m[..., 0]]
    assert s["features"]["ret"]["missing"] == pytest.approx(1 - m[..., 0].mean())
    assert s["features"]["ret"]["mean"] == pytest.approx(ret.mean(), rel=1e-4)
    assert s["features"]["ret"]["std"] == pytest.approx(ret.std(), rel=1e-4)
    assert main(["inspect", str(datasets[fmt])]) == 0
    out = capsys.readouterr().out
    assert "[time 1200, instrument 6, feature 3]" in out and "volume" in out


def test_the_commands_write_read_and_refuse_in_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "market"
    assert main(["synthetic", str(out), "--times", "300", "--instruments", "4"]) == 0
    assert main(["prepare", str(tmp_path / "nothing.csv"), str(tmp_path / "x")]) == 1
    assert main(["prepare", str(out / "times.npy"), str(out)]) == 1  # OUT exists
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tmp_path / 'nothing.csv'}: no such file or directory",
        f"error: {out}: already exists; remove it or choose another output directory",
    ]


def test_the_chunk_holds_whole_cross_sections_of_about_a_mebibyte(tmp_path) -> None:
    values, mask, times = generate(20_000, 16)
    m = prepare_npz(tmp_path, values, mask, times)
    assert m.chunk[1:] == [16, 3]
    assert m.chunk[0] * 16 * 3 * 4 == pytest.approx(1 << 20, rel=0.01)


def prepare_npz(tmp_path, values, mask, times):
    np.savez(tmp_path / "s.npz", values=values, mask=mask, times=times)
    return prepare(tmp_path / "s.npz", tmp_path / "out")
