"""The quant benchmark's data: an order-book-like series, seeded, and windows cut from it
by index arithmetic (one gather per batch, no per-sample Python).

Per time step the book has `levels` price levels a side; per level four features: the bid
and ask price's distance from the mid (in ticks) and the log sizes resting there; one more
column is the mid-price's last return. The mid's return follows
    r[t+1] = phi * r[t] + beta * imbalance[t] + noise,
autocorrelated (phi) and driven by the book's size imbalance, itself persistent (an AR(1)
factor), so that a window predicts the target, the next `horizon` returns summed, better
than zero does: a model can learn it. Targets are standardised with the training part's
mean and deviation, so predicting 0 has a validation loss (MSE) near 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FEATURES_PER_LEVEL = 4  # bid distance, ask distance, log bid size, log ask size


@dataclass(frozen=True)
class BookSpec:
    levels: int = 10
    lookback: int = 32
    horizon: int = 4
    train_samples: int = 50_000
    val_samples: int = 4_096
    seed: int = 0
    phi: float = 0.3  # the returns' autocorrelation
    beta: float = 0.5  # how much the imbalance moves the next return (in noise units)

    @property
    def width(self) -> int:
        """Columns per time step: every level's features, then the last return."""
        return self.levels * FEATURES_PER_LEVEL + 1


def _filter(u: torch.Tensor, phi: float) -> torch.Tensor:
    """x[t] = phi x[t-1] + u[t] with x[-1] = 0, as a causal convolution with phi^k truncated
    where phi^k < 1e-7 (no Python loop over time)."""
    taps = max(1, math.ceil(math.log(1e-7) / math.log(phi))) if 0 < phi < 1 else 1
    kernel = phi ** torch.arange(taps - 1, -1, -1, dtype=torch.float64)
    padded = torch.nn.functional.pad(u.double()[None, None], (taps - 1, 0))
    return torch.nn.functional.conv1d(padded, kernel[None, None])[0, 0].float()


def _ar1(phi: float, noise: torch.Tensor) -> torch.Tensor:
    """A stationary AR(1) series of unit variance driven by `noise` (unit variance)."""
    return _filter(noise * math.sqrt(1 - phi * phi), phi)


def order_book(spec: BookSpec, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([num_steps, width] features, [num_steps] mid returns) of one seeded book."""
    g = torch.Generator().manual_seed(spec.seed)
    levels = spec.levels
    # a persistent imbalance factor sets how much more rests on the bid than on the ask
    imbalance = torch.tanh(_ar1(0.95, torch.randn(num_steps, generator=g)))
    depth = torch.arange(1, levels + 1, dtype=torch.float32)
    base = 2.0 - 0.1 * depth  # log size falls off away from the touch
    bid_size = base + 0.5 * imbalance[:, None] + 0.3 * torch.randn(num_steps, levels, generator=g)
    ask_size = base - 0.5 * imbalance[:, None] + 0.3 * torch.randn(num_steps, levels, generator=g)
    spread = 1.0 + torch.abs(_ar1(0.9, torch.randn(num_steps, generator=g)))
    jitter = 0.2 * torch.randn(num_steps, levels, 2, generator=g)
    bid_dist = spread[:, None] / 2 + (depth - 1) + jitter[..., 0]
    ask_dist = spread[:, None] / 2 + (depth - 1) + jitter[..., 1]
    drive = torch.randn(num_steps, generator=g)  # r[t] = phi r[t-1] + beta imb[t-1] + noise
    drive[1:] += spec.beta * imbalance[:-1]
    returns = _filter(drive, spec.phi)
    per_level = torch.stack([bid_dist, ask_dist, bid_size, ask_size], dim=-1)
    features = torch.cat([per_level.flatten(1), returns[:, None]], dim=1)
    return features.float(), returns.float()


@dataclass
class Windows:
    """Training and validation windows of one book, on `device`: x[i] is rows
    [i, i + lookback) of the features, y[i] the standardised sum of the `horizon` returns
    after its last row. Validation windows come after every training window (no overlap)."""

    features: torch.Tensor  # [T, width]
    targets: torch.Tensor  # [T]: the target of a window ending at row t
    train_ends: torch.Tensor  # [train_samples]: each training window's last row
    val_ends: torch.Tensor  # [val_samples]
    lookback: int

    def batch(self, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, lookback, width], [B]) for windows ending at `ends`: one gather each."""
        offsets = torch.arange(-self.lookback + 1, 1, device=ends.device)
        rows = ends[:, None] + offsets
        return self.features[rows], self.targets[ends]

    def val(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch(self.val_ends)


def make_windows(spec: BookSpec, device: torch.device) -> Windows:
    """The book's windows, features and targets standardised on the training part only."""
    gap = spec.horizon + spec.lookback  # between the last training target and the first val row
    steps = spec.lookback + spec.train_samples + gap + spec.val_samples + spec.horizon
    features, returns = order_book(spec, steps)
    ahead = returns.unfold(0, spec.horizon, 1)[1:].sum(dim=1)  # ahead[t]: r[t+1..t+h]
    targets = torch.full((steps,), float("nan"))
    targets[: ahead.numel()] = ahead
    first = spec.lookback - 1
    train_ends = torch.arange(first, first + spec.train_samples)
    val_first = int(train_ends[-1]) + gap
    val_ends = torch.arange(val_first, val_first + spec.val_samples)
    train_rows = slice(0, int(train_ends[-1]) + 1)
    mean, std = features[train_rows].mean(0), features[train_rows].std(0).clamp_min(1e-6)
    features = (features - mean) / std
    t_mean, t_std = targets[train_ends].mean(), targets[train_ends].std()
    targets = (targets - t_mean) / t_std
    return Windows(
        features.to(device),
        targets.to(device),
        train_ends.to(device),
        val_ends.to(device),
        spec.lookback,
    )
