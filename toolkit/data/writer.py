"""Write a dataset directory atomically: everything goes to a temporary sibling directory,
renamed to OUT only once the manifest is written, so no reader ever sees half a dataset."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from toolkit.data.formats import write_part
from toolkit.data.manifest import (
    FORMATS,
    TIMES,
    DataError,
    Manifest,
    chunk_len_for,
    write_manifest,
)
from toolkit.data.moments import MOMENTS, per_chunk


def write_dataset(
    out: str | Path,
    values: np.ndarray,
    mask: np.ndarray,
    times: np.ndarray,
    instruments: list[str],
    features: list[str],
    fmt: str = "hdf5",
    chunk_len: int | None = None,
    chunks_per_part: int = 8,
) -> Manifest:
    """values, mask: [time, instrument, feature]; times: int64 [time], increasing. Parts of
    `chunks_per_part` chunks stand for the date partitions of a shared filesystem."""
    out = Path(out)
    if fmt not in FORMATS:
        raise DataError(f"format={fmt}: unknown; allowed: {', '.join(FORMATS)}")
    if out.exists():
        raise DataError(f"{out}: already exists; remove it or choose another output directory")
    t, n, f = values.shape
    if mask.shape != values.shape or len(times) != t or len(instruments) != n or len(features) != f:
        raise DataError(
            f"{out}: inconsistent shapes: values {values.shape}, mask {mask.shape}, "
            f"{len(times)} times, {len(instruments)} instruments, {len(features)} features"
        )
    times = np.asarray(times, dtype=np.int64)
    if t > 1 and not (np.diff(times) > 0).all():
        raise DataError(f"{out}: the time index is not strictly increasing; sort the source")
    chunk_len = min(chunk_len or chunk_len_for(n, f), max(t, 1))
    part_len = chunk_len * chunks_per_part
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        parts = [
            write_part(
                fmt,
                tmp,
                f"part-{i // part_len:05d}",
                values[i : i + part_len],
                mask[i : i + part_len],
                i,
                chunk_len,
                features,
            )
            for i in range(0, t, part_len)
        ]
        np.save(tmp / TIMES, times)
        np.save(tmp / MOMENTS, per_chunk(values, mask, chunk_len))
        manifest = Manifest(
            format=fmt,
            shape=[t, n, f],
            features=list(features),
            instruments=[str(x) for x in instruments],
            time_range=[int(times[0]), int(times[-1])] if t else [0, 0],
            chunk=[chunk_len, n, f],
            parts=parts,
            moments=MOMENTS,
        )
        write_manifest(tmp, manifest)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
