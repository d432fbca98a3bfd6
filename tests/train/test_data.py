"""The data schedule: deterministic, world-size independent, resumable."""

from __future__ import annotations

import numpy as np
import torch

from toolkit.config.data import DataConfig
from toolkit.train.data import (
    ArraySource,
    BatchPlan,
    Loader,
    SyntheticTokens,
    builtin_corpus,
    open_sources,
)


def _plan(world: int, rank: int, micro: int, accum: int) -> BatchPlan:
    return BatchPlan(
        seed=7, seq_len=16, micro_batch_size=micro, grad_accum=accum, world_size=world, rank=rank
    )


def test_global_batch_is_the_same_for_any_world_size() -> None:
    source = ArraySource(np.arange(10_000, dtype=np.uint8))

    def global_batch(world: int, micro: int, accum: int) -> torch.Tensor:
        rows = []
        for m in range(accum):
            for r in range(world):
                rows.append(_plan(world, r, micro, accum).micro_batches(source, "train", 5)[m][0])
        return torch.cat(rows)

    reference = global_batch(1, 8, 1)
    assert torch.equal(global_batch(2, 4, 1), reference)
    assert torch.equal(global_batch(4, 1, 2), reference)


def test_synthetic_tokens_do_not_depend_on_the_micro_batch_split() -> None:
    source = SyntheticTokens(vocab_size=256)
    whole = torch.cat([_plan(1, 0, 8, 1).micro_batches(source, "train", 3)[0][0]])
    halves = [_plan(2, r, 4, 1).micro_batches(source, "train", 3)[0][0] for r in (0, 1)]
    assert torch.equal(torch.cat(halves), whole)


def test_targets_are_inputs_shifted_by_one() -> None:
    source = ArraySource(np.arange(1000, dtype=np.uint8))
    x, y = _plan(1, 0, 2, 1).micro_batches(source, "train", 0)[0]
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_loader_resumes_at_the_saved_position() -> None:
    source = ArraySource(np.arange(5000, dtype=np.uint8))
    loader = Loader(source, _plan(1, 0, 2, 1), prefetch=2)
    batches = [next(loader) for _ in range(5)]
    state = loader.state_dict()
    loader.close()
    resumed = Loader(source, _plan(1, 0, 2, 1), prefetch=2)
    resumed.load_state_dict(state)
    step, micro = next(resumed)
    resumed.close()
    fresh = Loader(source, _plan(1, 0, 2, 1), prefetch=0)
    for _ in range(5):
        next(fresh)
    assert step == 5 == batches[-1][0] + 1
    assert torch.equal(micro[0][0], next(fresh)[1][0][0])


def test_builtin_corpus_is_real_text(tmp_path) -> None:
    path = builtin_corpus(str(tmp_path))
    text = path.read_bytes()
    assert len(text) > 300_000
    assert b"The " in text and b"function" in text
    sources = open_sources(DataConfig(kind="text", cache_dir=str(tmp_path)), 256)
    assert len(sources["train"]) > 19 * len(sources["val"]) * 0.9
