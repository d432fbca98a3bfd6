"""Models that split into pipeline stages by layers.

A model keeps its transformer layers in `blocks`, an nn.ModuleDict keyed "0".."L-1", so a
stage that holds layers 4..7 still names them `blocks.4...` to `blocks.7...`: every stage's
state-dict keys are the logical (unsplit) ones, and a checkpoint moves between layouts.
The input modules (INPUT) live on the first stage only, the output modules (OUTPUT) on the
last; elsewhere they are None and the stage's input and output are hidden states.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class StagedModel(nn.Module):
    INPUT: tuple[str, ...] = ()  # modules of the first stage (embeddings)
    OUTPUT: tuple[str, ...] = ()  # modules of the last stage (final norm, head)
    blocks: nn.ModuleDict
    kernels: str = "torch"  # the head and loss's kernels (toolkit.train.models.use_kernels)

    def part(self, layers: Iterable[int], first: bool, last: bool) -> StagedModel:
        """A model of the same class holding layers `layers` (and the input / output
        modules when `first` / `last`): the same module objects, not copies, so parameters
        are shared with this one and keep their names."""
        new = self.__class__.__new__(self.__class__)
        nn.Module.__init__(new)
        new.cfg = self.cfg
        new.kernels = self.kernels
        for name in self.INPUT:
            setattr(new, name, getattr(self, name) if first else None)
        new.blocks = nn.ModuleDict({str(i): self.blocks[str(i)] for i in layers})
        for name in self.OUTPUT:
            setattr(new, name, getattr(self, name) if last else None)
        return new

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x
