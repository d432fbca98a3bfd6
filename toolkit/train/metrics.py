"""Validation metrics besides the loss."""

from __future__ import annotations

import torch


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return torch.argsort(torch.argsort(x)).float()


def rank_ic(
    pred: torch.Tensor, target: torch.Tensor, group: int | None = None
) -> tuple[float, int]:
    """Information coefficient: the Spearman rank correlation between predictions and
    targets across instruments, per time step (row). Returns (sum over rows, rows) so
    callers can average over batches and ranks; rows with fewer than 3 observed targets
    or constant values are skipped. pred [batch, time, n] uses the last position.
    group: rows of one target each, `group` consecutive rows per time step (samples of
    one instrument each, toolkit.data.loader.Windows.whole_cross_sections)."""
    if pred.dim() == 3:
        pred = pred[:, -1]
    if group is not None:
        pred, target = pred.reshape(-1, group), target.reshape(-1, group)
    pred, target = pred.float().cpu(), target.float().cpu()
    total, rows = 0.0, 0
    for p, t in zip(pred, target, strict=True):
        observed = torch.isfinite(t)
        if int(observed.sum()) < 3:
            continue
        rp, rt = _ranks(p[observed]), _ranks(t[observed])
        rp, rt = rp - rp.mean(), rt - rt.mean()
        denom = float(rp.norm() * rt.norm())
        if denom > 0:
            total += float((rp * rt).sum()) / denom
            rows += 1
    return total, rows
