"""Your own torch Dataset (data._target_): the loader's batches, in-process, without training.

The global batch of a step is the same whatever the world size; the position after a resume
is the step alone (map-style) or the stream's saved state (IterableDataset, whose ranks
read their own shards: tests/data/test_streams.py)."""

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.shape import BatchShape
from toolkit.config.validate import problems
from toolkit.data.user import build_loaders, collated
from toolkit.errors import EXIT_CHECKPOINT_UNUSABLE, UserError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

NOISY = [
    "data._target_=userpkg.datasets.NoisySeries",
    "+data.length=40",
    "+data.seq_len=8",
    "+data.window=8",
]
SHAPE = ["+data.num_series=3", "+data.num_targets=2", "+data.num_workers=0"]


def job(*overrides: str):
    return to_job(compose_raw(["model=ts_transformer", "data=dataset", *overrides]))


def plan(world: int, rank: int, accum: int = 1, global_batch: int = 8) -> BatchShape:
    micro = global_batch // (world * accum)
    return BatchShape(
        seed=3, seq_len=8, micro_batch_size=micro, grad_accum=accum, world_size=world, rank=rank
    )


def global_batch(data, world: int, accum: int, steps: int) -> list[torch.Tensor]:
    """Each step's inputs of every rank, put back in global order."""
    loaders = [build_loaders(data, plan(world, r, accum), False)[0] for r in range(world)]
    out = []
    for _ in range(steps):
        per_rank = [next(loader)[1] for loader in loaders]
        out.append(torch.cat([per_rank[r][m][0] for m in range(accum) for r in range(world)]))
    return out


def test_a_dataset_node_composes_and_validates_with_the_time_series_model():
    j = job(*NOISY, *SHAPE)
    assert j.data.target == "userpkg.datasets.NoisySeries"
    assert j.data.kwargs == {"length": 40, "window": 8, "num_series": 3, "num_targets": 2}
    assert j.data.seq_len == 8 and j.data.num_workers == 0  # the toolkit's settings
    assert problems(j) == []
    bad = job("data._target_=NoisySeries", "+data.collate_fn=not a path")
    assert any("data._target_='NoisySeries': not an import path" in p for p in problems(bad))
    assert any("data.collate_fn='not a path'" in p for p in problems(bad))


@pytest.mark.parametrize("world, accum", [(2, 1), (2, 2), (4, 1)])
def test_the_global_batch_is_the_same_for_any_world_size(world, accum):
    data = job(*NOISY, *SHAPE).data
    one = global_batch(data, 1, 1, steps=7)  # 7 steps of 8 cross the 40-item epoch
    assert all(
        torch.equal(a, b) for a, b in zip(one, global_batch(data, world, accum, 7), strict=True)
    )
    assert not torch.equal(one[0], one[1])


def test_epochs_are_shuffled_by_seed_and_each_holds_every_item_once():
    data = job(*NOISY, *SHAPE).data
    loader, _ = build_loaders(data, plan(1, 0), False)
    order = loader.order
    epoch0, epoch1 = order.ids(0, 40), order.ids(40, 80)
    assert sorted(epoch0) == list(range(40)) and sorted(epoch1) == list(range(40))
    assert list(epoch0) != list(epoch1)  # each epoch in its own order
    ordered, _ = build_loaders(job(*NOISY, *SHAPE, "+data.shuffle=false").data, plan(1, 0), False)
    assert list(ordered.order.ids(0, 45)) == [*range(40), *range(5)]


def test_a_map_style_loader_resumes_at_a_step_and_refuses_another_dataset_length():
    data = job(*NOISY, *SHAPE).data
    loader, _ = build_loaders(data, plan(1, 0), False)
    batches = [next(loader)[1][0][0] for _ in range(4)]
    state = {"next_step": 2, "seed": 3, "num_items": 40}
    loader.load_state_dict(state)
    step, micro = next(loader)
    assert step == 2 and torch.equal(micro[0][0], batches[2])
    with pytest.raises(UserError, match="had 41 items, this one has 40"):
        loader.load_state_dict({**state, "num_items": 41})


def test_val_fraction_holds_out_the_last_items_and_a_collate_of_ones_own_makes_dicts():
    data = job(
        *NOISY, *SHAPE, "+data.val_fraction=0.2", "+data.collate_fn=userpkg.datasets.dict_collate"
    ).data
    train, val = build_loaders(data, plan(1, 0), False)
    assert train.order.num_anchors == 32 and val.order.num_anchors == 8
    micro = val.batch(0)[0]
    assert set(micro) == {"x", "y"} and micro["x"].shape == (8, 8, 3)


def test_an_iterable_dataset_resumes_exactly_from_its_saved_stream_state():
    data = job(
        "data._target_=userpkg.datasets.SeriesStream", "+data.seq_len=8", "+data.window=8", *SHAPE
    ).data
    loader, val = build_loaders(data, plan(1, 0), False)
    assert val is None
    for _ in range(3):
        next(loader)
    state = loader.state_dict()
    after = [next(loader)[1][0][0] for _ in range(2)]
    loader.close()
    # A fresh process: a new loader, the checkpoint's state.
    resumed = build_loaders(data, plan(1, 0), False)[0]
    resumed.load_state_dict(state)
    resumed.load_state_dict({"next_step": 3})  # the trainer's own call: already there
    for want in after:
        assert torch.equal(next(resumed)[1][0][0], want)
    resumed.close()
    # Each rank reads its own shard (tests/data/test_streams.py): positions do not reshard.
    with pytest.raises(UserError, match="split over 1 data-parallel ranks"):
        build_loaders(data, plan(2, 0), False)[0].load_state_dict(state)
    with pytest.raises(UserError, match="read by 2 workers.*resume with data.num_workers=2"):
        build_loaders(data, plan(1, 0), False)[0].load_state_dict({**state, "num_workers": 2})


def test_an_iterable_stream_with_workers_keeps_its_state_across_a_restart():
    data = job(
        "data._target_=userpkg.datasets.SeriesStream",
        "+data.seq_len=8",
        "+data.window=8",
        *SHAPE[:2],
        "+data.num_workers=1",
    ).data
    loader, _ = build_loaders(data, plan(1, 0), False)
    next(loader)
    state = loader.state_dict()
    want = next(loader)[1][0][0]
    loader.close()
    again, _ = build_loaders(data, plan(1, 0), False)
    again.load_state_dict(state)
    assert torch.equal(next(again)[1][0][0], want)
    again.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_wrong_shaped_item_is_named_by_its_index_in_one_line(workers):
    """Item 10 is one time step short: the step holding it fails naming item 10 and both
    shapes, also when a DataLoader worker collated it (no worker traceback in the line)."""
    flawed = [o.replace("NoisySeries", "FlawedSeries") for o in NOISY]
    shape = [o.replace("num_workers=0", f"num_workers={workers}") for o in SHAPE]
    data = job(*flawed, *shape, "+data.shuffle=false", "+data.short_items=[10]").data
    loader, _ = build_loaders(data, plan(1, 0), False)
    try:
        assert next(loader)[0] == 0  # items 0..7
        with pytest.raises(UserError) as caught:
            next(loader)  # items 8..15
    finally:
        loader.close()
    line = str(caught.value)
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("data._target_: item 10 has shape ([7, 3], [2]), unlike item 8's ")
    assert "([8, 3], [2]), so default_collate cannot batch them" in line
    assert caught.value.exit_code == EXIT_CHECKPOINT_UNUSABLE  # 65: the data is bad


def test_a_wrong_shaped_sample_of_a_stream_is_named_by_its_position():
    good, short = (torch.zeros(8, 3), torch.zeros(2)), (torch.zeros(7, 3), torch.zeros(2))
    names = [f"sample {8 + k} of the stream" for k in range(6)]
    with pytest.raises(UserError, match=r"^data._target_: sample 13 of the stream has shape"):
        collated(default_collate, [good] * 5 + [short], names)


def test_the_launcher_refuses_a_dataset_or_collate_that_does_not_import_in_one_line():
    from toolkit.train.targets import dataset_import_problems

    assert dataset_import_problems(job(*NOISY, *SHAPE), 1) == []
    bad = job("data._target_=userpkg.datasets.Missing", "+data.collate_fn=userpkg.nowhere.f")
    found = dataset_import_problems(bad, 1)
    assert len(found) == 2
    assert found[0].startswith("data._target_=userpkg.datasets.Missing: cannot import it")
    assert found[1].startswith("data.collate_fn=userpkg.nowhere.f: cannot import it")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned batches need CUDA")
@pytest.mark.parametrize("target", ["NoisySeries", "SeriesStream"])
def test_batches_for_a_gpu_come_in_pinned_memory(target):
    """data.pin_memory on a CUDA device: map-style and stream micro-batches (any collate's
    structure, here a dict) arrive page-locked, for the step's non-blocking copies."""
    extra = ["+data.length=40"] if target == "NoisySeries" else []
    data = job(
        f"data._target_=userpkg.datasets.{target}",
        "+data.seq_len=8",
        "+data.window=8",
        *extra,
        *SHAPE,
        "+data.collate_fn=userpkg.datasets.dict_collate",
    ).data
    loader, _ = build_loaders(data, plan(1, 0), True)
    try:
        _, [micro] = next(loader)
        assert micro["x"].is_pinned() and micro["y"].is_pinned()
    finally:
        loader.close()
