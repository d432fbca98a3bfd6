"""The dataset layout: a directory of time-partitioned part files plus `manifest.json`.

    OUT/manifest.json     shapes, dtype, feature names, instrument ids, time range, chunk, files
    OUT/times.npy         int64 time index, one entry per time step (e.g. days since epoch)
    OUT/part-00000.<ext>  values [time, instrument, feature] and a mask (1 = observed)

Every part holds whole chunks of `chunk[0]` time steps, so a chunk lies in one file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
TIMES = "times.npy"
FORMATS = ("hdf5", "parquet", "npy")
# A chunk of about this many bytes: large enough that one read amortises a shared
# filesystem's per-request latency (~ms), small enough that a window touches at most two
# chunks and a worker's cache holds dozens of them.
CHUNK_TARGET_BYTES = 1 << 20


class DataError(ValueError):
    """A dataset problem the user can act on: one line naming the file and what to do."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))


TIME_UNITS = (None, "day", "ns")


@dataclass
class Part:
    path: str  # relative to the dataset directory
    time_start: int  # first time step (row of times.npy) it holds
    time_stop: int  # one past the last
    num_bytes: int  # size on disk when written: a shorter file is truncated
    extra: list[str] = field(default_factory=list)  # further files of this part (npy mask)


@dataclass
class Manifest:
    format: str
    shape: list[int]  # [time, instrument, feature]
    features: list[str]
    instruments: list[str]
    time_range: list[int]  # first and last entry of times.npy
    chunk: list[int]  # [time, instrument, feature] of one chunk
    parts: list[Part]
    dtype: str = "float32"
    version: int = 1
    moments: str | None = None  # per-chunk moments file (toolkit.data.moments), if stored
    # What one unit of times.npy is: "day" (prepared from dates), "ns" (from timestamps), or
    # None (integers as the source wrote them; a manifest from before this field).
    time_unit: str | None = None

    @property
    def num_times(self) -> int:
        return self.shape[0]

    @property
    def chunk_len(self) -> int:
        return self.chunk[0]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        parts = [Part(**p) for p in d.pop("parts")]
        return cls(parts=parts, **d)


def chunk_len_for(num_instruments: int, num_features: int, itemsize: int = 4) -> int:
    """Time steps per chunk: whole cross-sections (all instruments and features of a time
    step), as many as make about CHUNK_TARGET_BYTES. Training reads windows of consecutive
    time steps, either of all instruments or of instruments drawn together from the same
    few chunks (toolkit.data.samples), so a chunk read once serves many samples."""
    row = num_instruments * num_features * itemsize
    return int(max(16, min(65536, CHUNK_TARGET_BYTES // max(row, 1))))


def read_manifest(root: str | Path) -> Manifest:
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise DataError(
            f"{path}: no manifest; write the dataset with `python -m toolkit.data prepare SRC "
            f"{root}` (or point data.path at a directory that has one)"
        )
    try:
        manifest = Manifest.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError) as exc:
        raise DataError(
            f"{path}: not a dataset manifest ({exc}); prepare the dataset again"
        ) from exc
    if manifest.format not in FORMATS:
        raise DataError(f"{path}: format={manifest.format}: unknown; allowed: {', '.join(FORMATS)}")
    check_consistent(path, manifest)
    for rel in listed_paths(manifest):
        inside(root, rel, path)
    return manifest


def listed_paths(manifest: Manifest) -> list[str]:
    """Every path the manifest names: the parts and their further files, the moments."""
    paths = [p for part in manifest.parts for p in (part.path, *part.extra)]
    return paths + ([manifest.moments] if manifest.moments is not None else [])


def inside(root: Path, rel: str, listed_in: Path) -> Path:
    """`root / rel`, once `rel` names a path inside the dataset directory: relative, no
    `..`, no symlink leading out. Raises DataError naming the manifest otherwise."""
    pure = PurePosixPath(rel) if isinstance(rel, str) else None
    if pure is None or not rel or pure.is_absolute() or ".." in pure.parts:
        raise DataError(
            f"{listed_in}: lists {rel!r}, a path outside the dataset directory; refused "
            "(paths are relative to the dataset directory, without '..')"
        )
    path = root / rel
    if not path.resolve().is_relative_to(root.resolve()):
        raise DataError(f"{listed_in}: lists {rel!r}, a symlink leading out of {root}; refused")
    return path


def check_consistent(path: Path, m: Manifest) -> None:
    """The manifest agrees with itself: a [time, instrument, feature] shape that the names,
    the parts' time ranges and the chunk fit, and a numeric dtype."""
    shape_ok = len(m.shape) == 3 and all(type(n) is int and n >= 0 for n in m.shape)
    problem = None
    if not shape_ok:
        problem = f"shape {m.shape} is not [time, instrument, feature] sizes"
    elif len(m.features) != m.shape[2]:
        problem = f"{len(m.features)} feature names for a shape of {m.shape[2]} features"
    elif len(m.instruments) != m.shape[1]:
        problem = f"{len(m.instruments)} instruments for a shape of {m.shape[1]}"
    elif len(m.chunk) != 3 or not all(type(n) is int and n >= 1 for n in m.chunk):
        problem = f"chunk {m.chunk} is not three positive sizes"
    elif not _numeric(m.dtype):
        problem = f"dtype {m.dtype!r} is not a numeric type (float or integer)"
    elif m.time_unit not in TIME_UNITS:
        problem = f"time_unit {m.time_unit!r} is not one of day, ns (or null)"
    else:
        for part in m.parts:
            if not 0 <= part.time_start < part.time_stop <= m.shape[0]:
                problem = (
                    f"part {part.path!r} holds time steps [{part.time_start}, {part.time_stop}), "
                    f"outside the shape's {m.shape[0]}"
                )
                break
    if problem is not None:
        raise DataError(f"{path}: {problem}; prepare the dataset again")


def _numeric(dtype: str) -> bool:
    import numpy as np

    try:
        return np.dtype(dtype).kind in "fiu"
    except TypeError:
        return False


def check_files(root: str | Path, manifest: Manifest) -> None:
    """Every file the manifest lists exists and has the size it was written with."""
    root = Path(root)
    for name in (TIMES, manifest.moments):
        if name is not None and not inside(root, name, root / MANIFEST).is_file():
            raise DataError(f"{root / name}: missing; prepare the dataset again")
    for part in manifest.parts:
        for rel, expected in [(part.path, part.num_bytes)] + [(e, None) for e in part.extra]:
            path = inside(root, rel, root / MANIFEST)
            if not path.is_file():
                raise DataError(
                    f"{path}: missing (listed in {root / MANIFEST}); restore it or prepare "
                    f"the dataset again"
                )
            size = path.stat().st_size
            if expected is not None and size != expected:
                raise DataError(
                    f"{path}: {size} bytes, the manifest says {expected} (truncated or "
                    f"rewritten); restore it or prepare the dataset again"
                )


def write_manifest(root: Path, manifest: Manifest) -> None:
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(manifest.to_json())
    os.replace(tmp, root / MANIFEST)
