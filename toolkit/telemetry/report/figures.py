"""What every report plot shares: a figure on matplotlib's Agg backend, and lines binned to
a bounded number of points (plots.py and curves.py draw with these)."""

from __future__ import annotations

from typing import Any

import numpy as np


def binned(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean of y over equal-count bins of x: at most max_points points per line."""
    if len(x) <= max_points:
        return x, y
    edges = np.linspace(0, len(x), max_points + 1).astype(int)
    xs = np.add.reduceat(x, edges[:-1]) / np.diff(edges)
    ys = np.add.reduceat(y, edges[:-1]) / np.diff(edges)
    return xs, ys


def figure(*args: Any, **kwargs: Any):
    """pyplot on the Agg backend (no display) and a new figure: (plt, (fig, axes))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.subplots(*args, **kwargs)
