"""Files the training data needs, created once by the launcher before any rank starts.

numpy only, no torch: the launcher imports this on every launch, and importing torch
there costs seconds before submission (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from toolkit.config.data import DataConfig


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def builtin_corpus(cache_dir: str) -> Path:
    """English prose shipped with every CPython: the documentation topics of `pydoc_data`
    (~0.7 MB). Written once as raw bytes into the cache; no download."""
    import pydoc_data.topics as topics
    import sys

    path = (
        Path(cache_dir).expanduser()
        / f"corpus-pydoc-{sys.version_info[0]}.{sys.version_info[1]}.txt"
    )
    if not path.exists():
        text = "\n\n".join(topics.topics[key] for key in sorted(topics.topics))
        _atomic_write(path, text.encode("utf-8"))
    return path


def prepare(cfg: DataConfig, num_series: int = 0, num_targets: int = 0) -> Path | None:
    """Create whatever files the data needs (the launcher calls this once, before ranks
    start); for returns, also check the dataset (toolkit.data.training: a DataError names
    the file and what to do)."""
    if cfg.kind == "text":
        return Path(cfg.path).expanduser() if cfg.path else builtin_corpus(cfg.cache_dir)
    if cfg.kind == "returns":
        from toolkit.data.training import prepare as prepare_dataset

        return prepare_dataset(cfg, num_series, num_targets)
    return None
