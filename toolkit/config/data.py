"""Training data: byte-level text memmap, synthetic tokens, or multivariate returns."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.config.errors import below_minimum
from toolkit.config.model import ModelConfig


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


def problems(d: DataConfig, model: ModelConfig) -> list[str]:
    """Problems with the data group and its fit to the model it feeds, one line each."""
    p = []
    if d.seq_len > model.max_seq_len:
        p.append(
            f"data.seq_len={d.seq_len}: above the model's maximum sequence length "
            f"(model.max_seq_len={model.max_seq_len}); use data.seq_len<={model.max_seq_len}"
        )
    p += below_minimum("data", d, {"seq_len": 2})
    if d.kind not in DataConfig.KINDS:
        p.append(f"data.kind={d.kind}: unknown; allowed: {', '.join(DataConfig.KINDS)}")
    if model.kind == "gpt" and d.kind == "returns":
        p.append("data=returns: feeds real-valued series; use model=ts_transformer (or data=text)")
    if model.kind == "timeseries" and d.kind != "returns":
        p.append(f"data={d.kind}: model=ts_transformer needs data=returns")
    if model.kind == "gpt" and d.kind in ("text", "synthetic") and model.vocab_size < 256:
        p.append(f"model.vocab_size={model.vocab_size}: byte-level data needs >= 256")
    if not 0.0 < d.val_fraction < 0.5:
        p.append(f"data.val_fraction={d.val_fraction}: must be in (0, 0.5)")
    return p
