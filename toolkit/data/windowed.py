"""Pre-windowed samples as a map-style torch Dataset: `data._target_=toolkit.data.WindowedSamples`.

X [sample, step, feature] (or [sample, feature]) inputs and y [sample] or [sample, target]
labels, from an .npz holding both (`path`) or two .npy files (`x`, `y`; memory-mapped, so a
file larger than memory trains). Never unpickled (allow_pickle=False). Item i is the pair
(X[i], y[i]) as float32 tensors, y always 1-D per sample ([num_targets]), which is what the
built-in time-series model trains on. `tensors()` gives the same rows as whole arrays, so the
samples can live on the training device (toolkit.data.device; docs/data.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from toolkit.errors import UserError


class WindowedSamples(Dataset):
    def __init__(self, path: str | None = None, x: str | None = None, y: str | None = None):
        if (path is None) == (x is None or y is None):
            raise UserError("data: WindowedSamples needs path (an .npz with X and y) or x and y")
        if path is not None:
            with np.load(Path(path).expanduser(), allow_pickle=False) as z:
                if not {"X", "y"} <= set(z.files):
                    raise UserError(f"data.path={path}: no X and y arrays (it has {z.files})")
                self.x, self.y = z["X"], z["y"]
        else:
            self.x = np.load(Path(x).expanduser(), mmap_mode="r", allow_pickle=False)
            self.y = np.load(Path(y).expanduser(), mmap_mode="r", allow_pickle=False)
        where = path or f"{x}, {y}"
        if len(self.x) != len(self.y):
            raise UserError(f"data: {where}: {len(self.x)} samples in X but {len(self.y)} in y")
        if self.y.ndim > 2:
            raise UserError(
                f"data: {where}: y has shape {self.y.shape}; use [sample] or [sample, target]"
            )

    def __len__(self) -> int:
        return len(self.x)

    def tensors(self) -> tuple[np.ndarray, np.ndarray]:
        """X and y whole, float32, y [sample, target]: item i is row i of each."""
        x = np.asarray(self.x, dtype=np.float32)
        return x, np.asarray(self.y, dtype=np.float32).reshape(len(self.y), -1)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(np.array(self.x[i], dtype=np.float32))
        y = torch.from_numpy(np.array(self.y[i], dtype=np.float32).reshape(-1))
        return x, y
