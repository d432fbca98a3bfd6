"""`python -m toolkit.data prepare SRC OUT`: convert CSV, Parquet or NumPy files into the
dataset layout (toolkit.data.manifest), written under a temporary name and renamed at the end.

Sources:
- CSV or Parquet, long format: one row per (time, instrument), columns `time`, `instrument`
  and one per feature; an empty cell or null is a missing value. SRC may be a directory of
  such files (e.g. one per date); rows are pivoted to [time, instrument, feature].
  A time column of dates becomes days since 1970-01-01, of timestamps nanoseconds since
  1970-01-01 (full resolution: minute bars stay apart); integers stay as they are.
  Files that do not overlap in time are converted one at a time (prepare_long), so a
  date-partitioned source larger than memory converts.
- NumPy: a .npy of [time, instrument] or, with `--layout series`, [time, instrument,
  feature] (NaN: missing), or a .npz with `values` and optional `mask`, `times`,
  `instruments`, `features`. Pre-windowed samples (an .npz with `X` and `y`) need no
  preparation: train on them with toolkit.data.WindowedSamples (refused here in one line).

The chunk is [chunk_len, all instruments, all features] with chunk_len chosen for about
1 MiB (toolkit.data.manifest.chunk_len_for): training reads windows of consecutive time
steps, so a chunk holds whole cross-sections of consecutive time steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.data.manifest import DataError, Manifest
from toolkit.data.writer import DatasetWriter, write_dataset

SUFFIXES = (".csv", ".parquet", ".npy", ".npz")
NONFINITE = ("refuse", "mask")  # an observed inf: refuse the source, or mark it missing


def check_finite(values: np.ndarray, mask: np.ndarray, where: Path, nonfinite: str) -> None:
    """An infinite observed value is refused in one line naming the first (NaN is a missing
    value already), or with nonfinite="mask" marked missing like NaN (in place)."""
    bad = np.isinf(values) & mask.astype(bool)
    if not bad.any():
        return
    if nonfinite == "mask":
        mask[bad] = 0
        values[bad] = np.nan
        return
    t, i, f = (int(x) for x in np.argwhere(bad)[0])
    raise DataError(
        f"{where}: {int(bad.sum())} infinite value(s), the first at time row {t}, instrument "
        f"{i}, feature {f}; fix the source, or pass --nonfinite=mask to treat them as missing"
    )


def source_files(src: Path) -> list[Path]:
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"{src}: no {', '.join(SUFFIXES)} files in this directory")
        kinds = {p.suffix for p in files}
        if len(kinds) > 1:
            raise DataError(f"{src}: mixes {', '.join(sorted(kinds))} files; use one kind")
        return files
    if not src.is_file():
        raise DataError(f"{src}: no such file or directory")
    if src.suffix not in SUFFIXES:
        raise DataError(f"{src}: unknown kind of file; use one of {', '.join(SUFFIXES)}")
    return [src]


def _read_table(path: Path, columns: list[str] | None = None):
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".csv":
            options = pcsv.ConvertOptions(include_columns=columns) if columns else None
            return pcsv.read_csv(path, convert_options=options)
        return pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise DataError(f"{path}: cannot be read ({exc}); check the file") from exc


def _times_as_int(column) -> np.ndarray:
    """Dates -> days since 1970-01-01; timestamps -> nanoseconds since 1970-01-01, full
    resolution (minute or tick bars keep their time of day); integers as they are. Strings
    parse as NumPy datetimes: date-only strings are days, any with a time of day nanoseconds."""
    import pyarrow as pa

    if pa.types.is_integer(column.type):
        return column.to_numpy().astype(np.int64)
    if pa.types.is_date(column.type):
        return column.cast(pa.date32()).to_numpy().astype("datetime64[D]").astype(np.int64)
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("ns")).to_numpy().astype("datetime64[ns]").astype(np.int64)
    parsed = np.asarray(column.to_pylist(), dtype="datetime64")
    unit = np.datetime_data(parsed.dtype)[0]
    return parsed.astype(
        "datetime64[D]" if unit in ("Y", "M", "W", "D") else "datetime64[ns]"
    ).astype(np.int64)


def _time_unit(column) -> str | None:
    """What _times_as_int makes of a time column: "day", "ns", or None (integers)."""
    import pyarrow as pa

    if pa.types.is_integer(column.type):
        return None
    if pa.types.is_date(column.type):
        return "day"
    if pa.types.is_timestamp(column.type):
        return "ns"
    parsed = np.asarray(column.slice(0, 1).to_pylist(), dtype="datetime64")
    return "day" if np.datetime_data(parsed.dtype)[0] in ("Y", "M", "W", "D") else "ns"


def _column_names(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".csv":
            return pcsv.open_csv(path).schema.names  # reads the first block only
        return pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{path}: cannot be read ({exc}); check the file") from exc


def _keys(path: Path, time_column: str, instrument_column: str):
    """Pass 1 reads only the two key columns of a file: its times and instruments."""
    import pyarrow as pa

    names = _column_names(path)
    for column in (time_column, instrument_column):
        if column not in names:
            raise DataError(
                f"{path}: no column {column!r}; it has {', '.join(names)} "
                f"(use --time-column/--instrument-column)"
            )
    features = [c for c in names if c not in (time_column, instrument_column)]
    if not features:
        raise DataError(
            f"{path}: no feature column, only {time_column!r} and {instrument_column!r}; add "
            "at least one column of numbers (one per feature)"
        )
    keys = _read_table(path, [time_column, instrument_column])
    for column in (time_column, instrument_column):
        missing = _missing(keys.column(column))
        if missing.any():
            raise DataError(
                f"{path}: {int(missing.sum())} row(s) with no {column!r} (null or empty), the "
                f"first is data row {int(np.argmax(missing)) + 1}; fill them in or drop those rows"
            )
    times = _times_as_int(keys.column(time_column))
    instruments = np.asarray(keys.column(instrument_column).cast(pa.string()).to_pylist())
    unit = _time_unit(keys.column(time_column)) if keys.num_rows else None
    return times, instruments, features, unit


def _missing(column) -> np.ndarray:
    """Rows whose key is null, or an empty or blank string (a CSV's empty cell)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    missing = column.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        blank = pc.equal(pc.utf8_trim_whitespace(column), "").fill_null(False)
        missing |= blank.to_numpy(zero_copy_only=False)
    return missing


def check_unique(keys: np.ndarray, time_values, instruments: np.ndarray, where) -> None:
    """One row per (time, instrument): else refused in one line naming the first pair that
    repeats (its time as the source writes it, its instrument) and the data rows holding
    it (1-based, header excluded; `where` is a list of (file, rows) when the rows came from
    several files, each row then named by its file)."""
    order = np.argsort(keys, kind="stable")  # equal keys in row order
    repeats = order[1:][keys[order[1:]] == keys[order[:-1]]]
    if not len(repeats):
        return
    row = int(repeats.min())  # the first row that repeats an earlier one
    rows = np.flatnonzero(keys == keys[row])
    named = ", ".join(_row_name(int(r), where) for r in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    source = where if not isinstance(where, list) else where[0][0].parent
    raise DataError(
        f"{source}: {len(repeats)} duplicate (time, instrument) row(s), the first is time "
        f"{time_values[row].as_py()}, instrument {str(instruments[row])!r} at data rows "
        f"{named}{more}; keep one row per time and instrument"
    )


def _row_name(row: int, where) -> str:
    """Row `row` (0-based) of the rows read, named as a 1-based data row (and its file)."""
    if not isinstance(where, list):
        return str(row + 1)
    for path, num_rows in where:
        if row < num_rows:
            return f"{row + 1} of {path.name}"
        row -= num_rows
    return str(row + 1)


def _pivot(table, times, instruments, features, time_column, instrument_column, where):
    """Long rows -> dense [len(times), len(instruments), len(features)] values and mask.
    `where`: the file, or (file, rows) of each file the rows came from, in order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t_idx = np.searchsorted(times, _times_as_int(table.column(time_column)))
    inst = np.asarray(table.column(instrument_column).cast(pa.string()).to_pylist())
    i_idx = np.searchsorted(instruments, inst)
    check_unique(t_idx * len(instruments) + i_idx, table.column(time_column), inst, where)
    where = where[0][0].parent if isinstance(where, list) else where
    values = np.full((len(times), len(instruments), len(features)), np.nan, np.float32)
    mask = np.zeros(values.shape, np.uint8)
    for j, feature in enumerate(features):
        column = table.column(feature)
        try:
            col = column.cast(pa.float32())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise DataError(
                f"{where}: feature column {feature!r} holds {column.type}, not numbers; convert "
                "it to numbers or drop it from the source"
            ) from None
        values[t_idx, i_idx, j] = col.to_numpy(zero_copy_only=False)
        mask[t_idx, i_idx, j] = pc.is_valid(col).to_numpy(zero_copy_only=False)
    mask[np.isnan(values) & mask.astype(bool)] = 0  # a NaN cell in a source is a missing value
    return values, mask


def prepare_long(
    files: list[Path],
    out: Path,
    fmt: str,
    chunk_len: int | None,
    time_column: str = "time",
    instrument_column: str = "instrument",
    nonfinite: str = "refuse",
) -> Manifest:
    """Two passes: the key columns of every file (the time index and the instrument
    universe), then one file at a time, pivoted and appended in time order. Memory holds one
    source file and one part, so a source larger than memory converts when it is split by
    date into files that do not overlap in time (files that do are read all at once)."""
    keys = [_keys(p, time_column, instrument_column) for p in files]
    features = keys[0][2]
    for path, (_, _, other, _) in zip(files, keys, strict=True):
        if other != features:
            raise DataError(
                f"{path}: features {other} differ from {files[0]}'s {features}; use one schema"
            )
    times = np.unique(np.concatenate([k[0] for k in keys]))
    instruments = np.unique(np.concatenate([k[1] for k in keys]))
    order = sorted(range(len(files)), key=lambda i: keys[i][0].min() if len(keys[i][0]) else 0)
    spans = [(keys[i][0].min(), keys[i][0].max()) for i in order if len(keys[i][0])]
    disjoint = all(a[1] < b[0] for a, b in zip(spans[:-1], spans[1:], strict=True))
    groups = [[files[i] for i in order]] if not disjoint else [[files[i]] for i in order]
    units = {k[3] for k in keys if len(k[0])}
    if len(units) > 1:
        raise DataError(
            f"{files[0].parent}: the files' time columns mix "
            f"{', '.join(sorted(str(u) for u in units))}; use one kind of time"
        )
    unit = units.pop() if units else None
    with DatasetWriter(
        out, times, list(instruments), features, fmt, chunk_len, time_unit=unit
    ) as writer:
        for group in groups:
            tables = [_read_table(p) for p in group]
            table = _concat(tables, [time_column, instrument_column, *features])
            if table.num_rows == 0:
                continue
            t = _times_as_int(table.column(time_column))
            lo, hi = np.searchsorted(times, t.min()), np.searchsorted(times, t.max()) + 1
            values, mask = _pivot(
                table,
                times[lo:hi],
                instruments,
                features,
                time_column,
                instrument_column,
                group[0]
                if len(group) == 1
                else [(p, t.num_rows) for p, t in zip(group, tables, strict=True)],
            )
            check_finite(values, mask, group[0] if len(group) == 1 else group[0].parent, nonfinite)
            writer.append(values, mask)
    return writer.manifest


def _concat(tables, columns):
    import pyarrow as pa

    return pa.concat_tables([t.select(columns) for t in tables], promote_options="permissive")


SAMPLES_HINT = (
    "train on pre-windowed samples directly: data=dataset "
    "data._target_=toolkit.data.WindowedSamples +data.path=FILE.npz (X and y)"
)


def from_numpy(path: Path, layout: str | None = None):
    """A NumPy source of series. A 3-D .npy is [time, instrument, feature] series or
    [sample, step, feature] pre-windowed samples, which its shape cannot tell apart: refused
    unless `layout="series"` says which. An .npz names its arrays (values: series; X and y:
    samples, refused here: they need no preparation)."""
    if path.suffix == ".npy":
        values = np.load(path, allow_pickle=False)
        extra: dict = {}
        if values.ndim == 3 and layout != "series":
            raise DataError(
                f"{path}: a 3-D array of shape {values.shape} may be series [time, instrument, "
                f"feature] or samples [sample, step, feature]; say --layout series to prepare "
                f"it as series, or {SAMPLES_HINT}"
            )
    else:
        with np.load(path, allow_pickle=False) as z:
            extra = {k: z[k] for k in z.files}
        if "values" not in extra and {"X", "y"} <= set(extra):
            raise DataError(
                f"{path}: holds pre-windowed samples (X, y), not series; {SAMPLES_HINT}"
            )
        if "values" not in extra:
            raise DataError(
                f"{path}: no 'values' array; the .npz needs values [time, instrument, feature] "
                "(or X and y: pre-windowed samples, trained on without preparing)"
            )
        values = extra.pop("values")
    if values.ndim == 2:
        values = values[:, :, None]
    if values.ndim != 3:
        raise DataError(f"{path}: shape {values.shape}; expected [time, instrument, feature]")
    t, n, f = values.shape
    values = values.astype(np.float32)
    mask = extra.get("mask")
    mask = ~np.isnan(values) if mask is None else mask.astype(bool) & ~np.isnan(values)
    times = extra.get("times", np.arange(t, dtype=np.int64))
    instruments = [str(x) for x in extra.get("instruments", [f"I{i:05d}" for i in range(n)])]
    features = [str(x) for x in extra.get("features", [f"f{j}" for j in range(f)])]
    if f == 1 and "features" not in extra:
        features = ["ret"]
    return values, mask.astype(np.uint8), np.asarray(times, np.int64), instruments, features


def prepare(
    src: str | Path,
    out: str | Path,
    fmt: str = "hdf5",
    chunk_len: int | None = None,
    time_column: str = "time",
    instrument_column: str = "instrument",
    nonfinite: str = "refuse",
    layout: str | None = None,
) -> Manifest:
    if Path(out).exists():  # before reading a large source
        raise DataError(f"{out}: already exists; remove it or choose another output directory")
    files = source_files(Path(src))
    if files[0].suffix in (".npy", ".npz"):
        if len(files) > 1:
            raise DataError(f"{src}: one NumPy file at a time")
        values, mask, times, instruments, features = from_numpy(files[0], layout)
        check_finite(values, mask, files[0], nonfinite)
        return write_dataset(
            out, values, mask, times, instruments, features, fmt=fmt, chunk_len=chunk_len
        )
    return prepare_long(files, Path(out), fmt, chunk_len, time_column, instrument_column, nonfinite)
