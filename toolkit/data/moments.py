"""Per-feature moments (count, sum, sum of squares) of observed values, the sums behind
normalisation and `inspect`. prepare stores them per chunk (`moments.npy`), so the
statistics of any period read only its partial chunks at the two ends."""

from __future__ import annotations

import numpy as np

MOMENTS = "moments.npy"


def chunk_moments(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[3, feature]: count, sum and sum of squares of the observed values."""
    mask = mask.astype(bool)
    x = np.where(mask, values, 0.0).astype(np.float64)
    return np.stack([mask.sum(axis=(0, 1)), x.sum(axis=(0, 1)), (x * x).sum(axis=(0, 1))])


def per_chunk(values: np.ndarray, mask: np.ndarray, chunk_len: int) -> np.ndarray:
    """[chunk, 3, feature] for a whole dataset held in memory (prepare)."""
    return np.stack(
        [
            chunk_moments(values[i : i + chunk_len], mask[i : i + chunk_len])
            for i in range(0, len(values), chunk_len)
        ]
    )


def period_moments(reader, start: int, stop: int) -> np.ndarray:
    """[3, feature] over time steps [start, stop): stored moments for the chunks inside,
    reads for the partial chunks at the ends (all of it when none are stored)."""
    stored = reader.moments
    if stored is None:
        return sum((chunk_moments(v, m) for _, v, m in reader.iter_chunks(start, stop)), 0.0)
    c, t = reader.manifest.chunk_len, reader.manifest.num_times
    first = -(-start // c)  # the first chunk starting at or after start
    last = first
    while last < len(stored) and min((last + 1) * c, t) <= stop:
        last += 1
    if last == first:  # no whole chunk inside
        return sum((chunk_moments(v, m) for _, v, m in reader.iter_chunks(start, stop)), 0.0)
    total = stored[first:last].sum(axis=0)
    for lo, hi in ((start, first * c), (min(last * c, t), stop)):
        if hi > lo:
            total = total + sum(
                (chunk_moments(v, m) for _, v, m in reader.iter_chunks(lo, hi)), 0.0
            )
    return total


def mean_std(moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    count, total, total_sq = moments
    mean = total / np.maximum(count, 1)
    std = np.sqrt(np.maximum(total_sq / np.maximum(count, 1) - mean**2, 0.0))
    return mean, std
