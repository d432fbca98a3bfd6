"""Your own IterableDataset (data._target_): split across ranks and DataLoader workers,
finite streams read epoch after epoch, and the epoch every loader reports
(toolkit.data.streams, toolkit.data.user.StreamLoader; docs/data.md)."""

import sys
from pathlib import Path

import pytest

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.shape import BatchShape
from toolkit.data.user import build_loaders
from toolkit.errors import EXIT_RESUME_REFUSED, UserError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))


def stream(length: int = 24, shards: str = "toolkit", workers: int = 0, **more: str):
    overrides = [
        "model=ts_transformer",
        "data=dataset",
        "data._target_=userpkg.datasets.CountedStream",
        f"+data.length={length}",
        "+data.seq_len=4",
        "+data.window=4",
        "+data.num_series=2",
        "+data.num_targets=1",
        f"+data.shards={shards}",
        f"+data.num_workers={workers}",
        *[f"+data.{k}={v}" for k, v in more.items()],
    ]
    return to_job(compose_raw(overrides)).data


def plan(world: int, rank: int, micro: int = 2, accum: int = 1) -> BatchShape:
    return BatchShape(
        seed=3, seq_len=4, micro_batch_size=micro, grad_accum=accum, world_size=world, rank=rank
    )


def items(batches) -> list[int]:
    """The item numbers of a step's micro-batches (each item's y is its number)."""
    return [int(v) for micro in batches for v in micro[1][:, 0]]


def read(loader, steps: int) -> list[list[int]]:
    try:
        return [items(next(loader)[1]) for _ in range(steps)]
    finally:
        loader.close()


@pytest.mark.parametrize("shards, workers", [("toolkit", 0), ("toolkit", 2), ("shard", 2)])
def test_each_rank_and_worker_reads_its_own_part_of_the_stream(shards, workers):
    """Two ranks with two workers each: four readers, each item read by exactly one of
    them, so one epoch of 24 items is 6 steps of 2 ranks x 2 samples."""
    data = stream(24, shards, workers)
    per_rank = [read(build_loaders(data, plan(2, r), False)[0], 6) for r in range(2)]
    seen = [i for steps in per_rank for step in steps for i in step]
    assert sorted(seen) == list(range(24))
    if workers == 2:  # reader k of 4 (rank * 2 + worker) takes items k, k + 4, ...
        assert per_rank[1][0] == [2, 3]


def test_a_finite_stream_ends_its_epoch_and_starts_the_next():
    """10 items in steps of 4: step 2 takes items 8, 9 and the next epoch's 0, 1; the
    dataset's set_epoch is called before each epoch; the loader counts epochs."""
    loader, _ = build_loaders(stream(10), plan(1, 0, micro=4), False)
    got = []
    for _ in range(3):
        got.append(items(next(loader)[1]))
        got.append(loader.epoch)
    loader.close()
    assert got == [[0, 1, 2, 3], 0, [4, 5, 6, 7], 0, [8, 9, 0, 1], 1]
    assert loader.stream.dataset.epochs_set == [0, 1]


@pytest.mark.parametrize("shards", ["toolkit", "shard"])
def test_a_stream_with_state_resumes_exactly_also_across_an_epoch_end(shards):
    """Two ranks, one worker each: a run saved after step 2 and resumed in fresh loaders
    gives the batches of the run that went on (steps 3..6 cross the end of epoch 0)."""
    data = stream(14, shards, 1)
    whole = [read(build_loaders(data, plan(2, r), False)[0], 6) for r in range(2)]
    first = [build_loaders(data, plan(2, r), False)[0] for r in range(2)]
    for loader in first:
        read(loader, 0)
        for _ in range(2):
            next(loader)
    states = [loader.state_dict() for loader in first]
    for loader in first:
        loader.close()
    # Without a process group each rank's state holds its own stream; a job's gathers all.
    saved = {**states[0], "ranks": {**states[0]["ranks"], **states[1]["ranks"]}}
    resumed = [build_loaders(data, plan(2, r), False)[0] for r in range(2)]
    for r, loader in enumerate(resumed):
        loader.load_state_dict(saved)
        loader.load_state_dict({"next_step": 2})  # the trainer's own call: already there
        assert read(loader, 4) == whole[r][2:]
    assert resumed[0].epoch == 1
    with pytest.raises(UserError, match="split over 2 data-parallel ranks.*resume on 2") as e:
        build_loaders(data, plan(1, 0), False)[0].load_state_dict(saved)
    assert e.value.exit_code == EXIT_RESUME_REFUSED


def test_an_empty_shard_is_one_line_not_a_stop_iteration():
    loader, _ = build_loaders(stream(1), plan(2, 1, micro=1), False)
    with pytest.raises(UserError, match="gave rank 1 no sample in epoch 0"):
        read(loader, 1)


def test_map_style_loaders_count_epochs_by_position():
    data = to_job(
        compose_raw(
            [
                "model=ts_transformer",
                "data=dataset",
                "data._target_=userpkg.datasets.NoisySeries",
                "+data.length=20",
                "+data.seq_len=8",
                "+data.window=8",
                "+data.num_series=3",
                "+data.num_targets=2",
                "+data.num_workers=0",
            ]
        )
    ).data
    loader, _ = build_loaders(data, plan(1, 0, micro=8), False)
    epochs = []
    for _ in range(6):  # samples 0..47 of 20-item epochs: steps start at 0, 8, 16, 24, 32, 40
        next(loader)
        epochs.append(loader.epoch)
    assert epochs == [0, 0, 0, 1, 1, 2]
