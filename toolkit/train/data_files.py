"""Files the training data needs, created once by the launcher before any rank starts.

numpy only, no torch: the launcher imports this on every launch, and importing torch
there costs seconds before submission (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

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


def synthetic_returns(
    cache_dir: str, num_series: int, length: int = 200_000, seed: int = 1234
) -> Path:
    """A factor model with predictable structure: r_t = B f_t + e_t, f_t = 0.6 f_{t-1} + u_t,
    so the next step is partly forecastable from the past (MSE can fall below the variance)."""
    path = Path(cache_dir).expanduser() / f"returns-synthetic-{num_series}x{length}-{seed}.npy"
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    num_factors = max(1, num_series // 8)
    loadings = rng.normal(0, 1, (num_series, num_factors)).astype(np.float32)
    factors = np.zeros((length, num_factors), dtype=np.float32)
    shocks = rng.normal(0, 1, (length, num_factors)).astype(np.float32)
    for t in range(1, length):
        factors[t] = 0.6 * factors[t - 1] + shocks[t]
    noise = rng.normal(0, 0.5, (length, num_series)).astype(np.float32)
    returns = factors @ loadings.T / np.sqrt(num_factors) + noise
    returns /= returns.std(axis=0, keepdims=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")
    os.close(fd)
    np.save(tmp, returns.astype(np.float32))
    os.replace(tmp, path)
    return path


def prepare(cfg: DataConfig, num_series: int = 0) -> Path | None:
    """Create whatever files the data needs (the launcher calls this once, before ranks start)."""
    if cfg.kind == "text":
        return Path(cfg.path).expanduser() if cfg.path else builtin_corpus(cfg.cache_dir)
    if cfg.kind == "returns":
        return (
            Path(cfg.path).expanduser()
            if cfg.path
            else synthetic_returns(cfg.cache_dir, num_series)
        )
    return None
