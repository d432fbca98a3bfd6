"""Training data: byte-level text memmap, synthetic tokens, or multivariate returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    kind: str = "text"  # text | synthetic | returns
    # text: a UTF-8 file, tokenised as bytes. None: the built-in corpus (Python's own
    # documentation topics, generated once into cache_dir; no download).
    # returns: a float32 .npy of shape [time, num_series]. None: a synthetic factor model.
    path: str | None = None
    seq_len: int = 128
    val_fraction: float = 0.05
    cache_dir: str = "~/.cache/toolkit"
    prefetch: int = 2  # batches prepared ahead by a background thread (0: inline)

    KINDS = ("text", "synthetic", "returns")
