"""A synthetic market: a factor model with regime changes and missing data, written in the
dataset layout (toolkit.data.manifest) for tests, benchmarks and the returns preset.

    ret[t, i]    = vol_t * (B_i . f_t + e[t, i]) + 0.3 * signal[t-1, i]
    f_t          = phi_t f_{t-1} + u_t       (phi and vol switch with a two-state regime)
    signal[t, i] : observed at t, predicts part of ret[t+1, i] (a real, leak-free edge)
    volume[t, i] : log volume, rising with |ret|

Instruments list at staggered dates (unobserved before) and 1 % of values are missing at
random, so masks, normalisation and the loss's handling of gaps are exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.data.manifest import MANIFEST, Manifest, read_manifest
from toolkit.data.writer import write_dataset

FEATURES = ["ret", "signal", "volume"]


def generate(
    num_times: int, num_instruments: int, seed: int = 1234
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """values, mask [time, instrument, feature] and an int64 time index (days)."""
    rng = np.random.default_rng(seed)
    t, n = num_times, num_instruments
    k = max(1, n // 8)
    regime = np.zeros(t, dtype=np.int64)
    for s in range(1, t):  # two states, each lasting ~500 steps on average
        regime[s] = regime[s - 1] ^ (rng.random() < 1 / 500)
    phi = np.where(regime == 1, -0.2, 0.5).astype(np.float32)
    vol = np.where(regime == 1, 2.0, 1.0).astype(np.float32)
    shocks = rng.normal(0, 1, (t, k)).astype(np.float32)
    factors = np.zeros((t, k), np.float32)
    for s in range(1, t):
        factors[s] = phi[s] * factors[s - 1] + shocks[s]
    loadings = rng.normal(0, 1, (n, k)).astype(np.float32) / np.sqrt(k)
    signal = rng.normal(0, 1, (t, n)).astype(np.float32)
    ret = vol[:, None] * (factors @ loadings.T + rng.normal(0, 1, (t, n)).astype(np.float32))
    ret[1:] += 0.3 * signal[:-1]
    volume = 10 + 0.5 * np.abs(ret) + rng.normal(0, 0.2, (t, n)).astype(np.float32)
    values = np.stack([ret, signal, volume], axis=-1).astype(np.float32)
    mask = rng.random((t, n, len(FEATURES))) > 0.01
    listed = rng.integers(0, max(1, t // 10), n)
    listed[0] = 0
    mask &= np.arange(t)[:, None, None] >= listed[None, :, None]
    times = np.arange(t, dtype=np.int64) + 10_957  # days since 1970: from 2000-01-01
    return values, mask.astype(np.uint8), times


def write_synthetic(
    out: str | Path,
    num_times: int = 20_000,
    num_instruments: int = 16,
    fmt: str = "hdf5",
    seed: int = 1234,
    chunk_len: int | None = None,
) -> Manifest:
    values, mask, times = generate(num_times, num_instruments, seed)
    names = [f"SYN{i:04d}" for i in range(num_instruments)]
    return write_dataset(
        out, values, mask, times, names, FEATURES, fmt=fmt, chunk_len=chunk_len, time_unit="day"
    )


def cached_synthetic(
    cache_dir: str, num_times: int, num_instruments: int, fmt: str, seed: int = 1234
) -> Path:
    """The synthetic dataset in the cache, written once (a concurrent writer loses the
    rename race harmlessly: the first complete directory wins)."""
    out = Path(cache_dir).expanduser() / f"market-{fmt}-{num_times}x{num_instruments}-{seed}"
    if not (out / MANIFEST).exists():
        try:
            write_synthetic(out, num_times, num_instruments, fmt, seed)
        except (OSError, ValueError):
            if not (out / MANIFEST).exists():
                raise
    read_manifest(out)
    return out
