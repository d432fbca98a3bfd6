"""Token data (toolkit.data.tokens): deterministic, world-size independent, resumable, and
the same batches whether DataLoader workers or the training process read them."""

from __future__ import annotations

import numpy as np
import torch

from toolkit.config.data import DataConfig
from toolkit.data.files import builtin_corpus
from toolkit.data.tokens import (
    BatchPlan,
    MappedTokens,
    SyntheticTokens,
    TokenLoader,
    open_sources,
)


def _plan(world: int, rank: int, micro: int, accum: int) -> BatchPlan:
    return BatchPlan(
        seed=7, seq_len=16, micro_batch_size=micro, grad_accum=accum, world_size=world, rank=rank
    )


def _counting_file(tmp_path, n: int) -> MappedTokens:
    """A corpus whose byte i is i % 256, so a window shows where it starts."""
    path = tmp_path / "corpus.bin"
    path.write_bytes(np.arange(n, dtype=np.uint8).tobytes())
    return MappedTokens(path, 0, n)


def test_global_batch_is_the_same_for_any_world_size(tmp_path) -> None:
    source = _counting_file(tmp_path, 10_000)

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


def test_targets_are_inputs_shifted_by_one(tmp_path) -> None:
    source = _counting_file(tmp_path, 1000)
    x, y = _plan(1, 0, 2, 1).micro_batches(source, "train", 0)[0]
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_loader_resumes_at_the_saved_position(tmp_path) -> None:
    """Two workers read a memory-mapped file; a loader resumed from their state gives the
    step the training process computes itself, bit for bit."""
    source = _counting_file(tmp_path, 5000)
    loader = TokenLoader(source, _plan(1, 0, 2, 1), num_workers=2)
    batches = [next(loader) for _ in range(5)]
    state = loader.state_dict()
    loader.close()
    resumed = TokenLoader(source, _plan(1, 0, 2, 1), num_workers=2)
    resumed.load_state_dict(state)
    step, micro = next(resumed)
    resumed.close()
    fresh = TokenLoader(source, _plan(1, 0, 2, 1), num_workers=0)
    for _ in range(5):
        next(fresh)
    assert step == 5 == batches[-1][0] + 1
    assert torch.equal(micro[0][0], next(fresh)[1][0][0])


def test_a_mapped_file_is_mapped_by_each_process_that_reads_it(tmp_path) -> None:
    """Pickled for a worker, a source carries its path and range, not the corpus."""
    import pickle

    path = tmp_path / "corpus.bin"
    path.write_bytes(bytes(range(256)) * 64)
    source = MappedTokens(path, 256, 4096)
    x, _ = source.window(np.array([0, 10]), 8)
    copy = pickle.loads(pickle.dumps(source))
    assert len(pickle.dumps(source)) < 1000 and copy._array is None
    assert torch.equal(copy.window(np.array([0, 10]), 8)[0], x)
    assert x[1, 0].item() == 10


def test_builtin_corpus_is_real_text(tmp_path) -> None:
    path = builtin_corpus(str(tmp_path))
    text = path.read_bytes()
    assert len(text) > 300_000
    assert b"The " in text and b"function" in text
    sources = open_sources(DataConfig(kind="text", cache_dir=str(tmp_path)), 256)
    assert len(sources["train"]) > 19 * len(sources["val"]) * 0.9


def test_token_market_and_user_loaders_all_implement_the_trainers_loader_contract(datasets):
    """One Loader protocol (toolkit.data.loader.Loader) for every dataset the Trainer reads."""
    from torch.utils.data import IterableDataset, TensorDataset

    from tests.data.conftest import config
    from toolkit.data import loader as market
    from toolkit.data import user

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(100.0))

    shape = _plan(1, 0, 2, 1)
    loaders = [
        TokenLoader(SyntheticTokens(256), shape, num_workers=0),
        market.build_loaders(config(datasets["npy"]), shape, 18, 6, False)[0],
        user.map_loader(
            TensorDataset(torch.arange(10.0)), user.DatasetConfig("x.Y"), shape, "train", False
        ),
        user.StreamLoader(Stream(), shape, user.collate_of(None), num_workers=0),
    ]
    for loader in loaders:
        assert isinstance(loader, market.Loader), type(loader).__name__
        step, micro_batches = next(loader)
        assert step == 0 and len(micro_batches) == shape.grad_accum
        assert loader.state_dict()["next_step"] == 1
        loader.close()
