"""`python -m toolkit.data inspect OUT`: shapes, time range, files, and per feature the
missing fraction and statistics of the observed values (streamed chunk by chunk)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.data.moments import chunk_moments, mean_std
from toolkit.data.reader import DatasetReader


def summary(root: str | Path) -> dict:
    """Statistics of the finite observed values; NaN or inf where the mask says observed
    (which training refuses) are counted apart and named in `warnings`."""
    reader = DatasetReader(root, refuse_nonfinite=False)
    m = reader.manifest
    f = m.shape[2]
    moments = np.zeros((3, f))
    nonfinite = np.zeros(f, np.int64)
    first_bad: tuple[int, int, int] | None = None
    low = np.full(f, np.inf)
    high = np.full(f, -np.inf)
    for t0, v, mask in reader.iter_chunks():  # every chunk: min and max are not stored
        bad = mask & ~np.isfinite(v)
        if bad.any():
            nonfinite += bad.sum(axis=(0, 1))
            if first_bad is None:
                t, i, j = (int(x) for x in np.argwhere(bad)[0])
                first_bad = (t0 + t, i, j)
            mask = mask & ~bad
        moments += chunk_moments(v, mask)
        low = np.minimum(low, np.where(mask, v, np.inf).min(axis=(0, 1)))
        high = np.maximum(high, np.where(mask, v, -np.inf).max(axis=(0, 1)))
    reader.close()
    cells = m.shape[0] * m.shape[1]
    count = moments[0]
    mean, std = mean_std(moments)
    features = {
        name: {
            "missing": 1 - (count[j] + nonfinite[j]) / max(cells, 1),
            "nonfinite": int(nonfinite[j]),
            "mean": mean[j],
            "std": std[j],
            "min": low[j],
            "max": high[j],
        }
        for j, name in enumerate(m.features)
    }
    warnings = []
    if first_bad is not None:
        t, i, j = first_bad
        part = next(p for p in m.parts if p.time_start <= t < p.time_stop)
        counts = ", ".join(f"{n} in {m.features[k]}" for k, n in enumerate(nonfinite) if n)
        warnings.append(
            f"{int(nonfinite.sum())} NaN/inf value(s) where the mask says observed ({counts}; "
            f"the first in {Path(root) / part.path} at row {t - part.time_start}, instrument "
            f"{i}); training refuses this dataset: fix the values or set the mask to 0 there, "
            "then prepare it again (the statistics above leave them out)"
        )
    size = sum((Path(root) / p.path).stat().st_size for p in m.parts)
    return {"manifest": m, "bytes": size, "features": features, "warnings": warnings}


def format_summary(root: str | Path, s: dict) -> str:
    m = s["manifest"]
    lines = [
        f"dataset    {root}",
        f"format     {m.format}, {len(m.parts)} part files, {s['bytes'] / 2**20:.1f} MiB",
        f"shape      [time {m.shape[0]}, instrument {m.shape[1]}, feature {m.shape[2]}] {m.dtype}",
        f"chunk      {m.chunk} ({m.chunk[0]} time steps of every instrument and feature)",
        f"time       {m.time_range[0]} .. {m.time_range[1]}",
        f"instruments {', '.join(m.instruments[:5])}{' ...' if len(m.instruments) > 5 else ''}",
        f"{'feature':<16}{'missing':>9}{'mean':>12}{'std':>12}{'min':>12}{'max':>12}",
    ]
    for name, st in s["features"].items():
        lines.append(
            f"{name:<16}{100 * st['missing']:>8.2f}%{st['mean']:>12.4g}{st['std']:>12.4g}"
            f"{st['min']:>12.4g}{st['max']:>12.4g}"
        )
    lines += [f"warning: {w}" for w in s["warnings"]]
    return "\n".join(lines)
