"""Device-resident data (toolkit.data.device): the host loader's batches, bitwise, whether the
tables are resident or streamed in chunks; exact resume mid-epoch, from either path's
checkpoint and on another world size; your own arrays through `tensors()`; and the line
that says which path was taken and why. On this CPU the device is the CPU: the same code
cuts the batches on a GPU (scripts/gpu_check.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.data.conftest import config
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.data import DataConfig, problems
from toolkit.config.model import TimeSeriesConfig
from toolkit.data.device import (
    MarketDeviceLoader,
    MiB,
    dataset_loaders,
    market_loaders,
    place,
)
from toolkit.data.loader import SamplePlan, build_loaders
from toolkit.data.synthetic import write_synthetic
from toolkit.errors import UserError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

CPU = torch.device("cpu")
STEPS = 5


def plan(world: int = 1, rank: int = 0, micro: int = 8, accum: int = 2) -> SamplePlan:
    return SamplePlan(
        seed=11, seq_len=16, micro_batch_size=micro, grad_accum=accum, world_size=world, rank=rank
    )


def shape(sample: str) -> tuple[int, int]:
    return (18, 6) if sample == "cross_section" else (3, 1)


def host(path, p: SamplePlan, sample: str = "cross_section", **overrides):
    cfg = config(path, sample=sample, **overrides)
    return build_loaders(cfg, p, *shape(sample), False)


def device(path, p: SamplePlan, sample: str = "cross_section", **overrides):
    cfg = config(path, sample=sample, **overrides)
    return market_loaders(cfg, p, *shape(sample), CPU, False)


def same(a, b) -> bool:
    """Equal bitwise, NaN targets (a missing step ahead) included."""
    return all(
        x.shape == y.shape and torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0))
        for x, y in zip(a, b, strict=True)
    )


def steps(loader, n: int) -> list:
    out = [next(loader) for _ in range(n)]
    loader.close()
    return out


def same_steps(got: list, want: list) -> bool:
    return [s for s, _ in got] == [s for s, _ in want] and all(
        same(a, b)
        for (_, ga), (_, wa) in zip(got, want, strict=True)
        for a, b in zip(ga, wa, strict=True)
    )


@pytest.mark.parametrize(
    "sample,horizon",
    # A horizon of 9: numpy sums one instrument's 9 steps ahead pairwise, the device too.
    [("cross_section", 2), ("per_instrument", 9)],
)
def test_device_batches_equal_the_host_loaders_bitwise(datasets, sample, horizon) -> None:
    path = datasets["npy"]
    reference, reference_val = host(path, plan(), sample, horizon=horizon)
    loader, val, placement = device(path, plan(), sample, horizon=horizon)
    assert placement.path == "resident"
    assert placement.line.startswith("data: device-resident, 0.10 MiB of a ")
    assert same_steps(steps(loader, STEPS), steps(reference, STEPS))
    for i in range(2):  # validation: per_instrument by whole cross-sections
        assert same(val.batch(i)[0], reference_val.batch(i)[0])


def test_streamed_chunks_give_the_resident_batches_across_epochs(datasets) -> None:
    loader, _, _ = device(datasets["hdf5"], plan())
    epoch_steps = loader.windows.order.epoch_len // 16
    resident = steps(loader, epoch_steps + 3)  # into the second epoch
    streamed = MarketDeviceLoader(loader.windows, plan(), CPU, steps_per_chunk=7)
    got = [next(streamed) for _ in range(epoch_steps + 3)]
    copied = streamed._stream.bytes_copied
    streamed.close()
    assert same_steps(got, resident)
    table_bytes = sum(t.nbytes for t in loader.windows.host_tables())
    # Each chunk copies the rows its 7 steps read (a group of chunks of the sample order),
    # fewer than the whole tables; over an epoch and a bit, about the tables once or twice.
    assert table_bytes < copied < 4 * table_bytes


def test_resume_mid_epoch_is_exact_and_either_path_resumes_the_others_checkpoint(
    datasets,
) -> None:
    path = datasets["parquet"]
    reference = steps(host(path, plan())[0], 2 * STEPS)
    first, _, _ = device(path, plan())
    before = [next(first) for _ in range(STEPS)]
    state = first.state_dict()
    first.close()
    assert set(state) == set(host(path, plan())[0].state_dict())  # one checkpoint format
    resumed, _, _ = device(path, plan())
    resumed.load_state_dict(state)
    assert same_steps(before + steps(resumed, STEPS), reference)
    on_host = host(path, plan())[0]
    on_host.load_state_dict(state)
    assert same_steps(steps(on_host, 2), reference[STEPS : STEPS + 2])
    streamed = MarketDeviceLoader(resumed.windows, plan(), CPU, steps_per_chunk=3)
    streamed.load_state_dict(state)  # mid-chunk: chunk 1 holds steps 3..5
    assert same_steps(steps(streamed, STEPS), reference[STEPS:])


def test_two_ranks_checkpoint_resumes_on_one_rank_with_the_same_samples(datasets) -> None:
    """Rank r takes the slice [(m * world + r) * micro, +micro) of a step's global batch, as
    the host loader does: the 2-rank position resumes on 1 rank (the Trainer keeps the
    global batch of 16 and re-splits it), and step 4's samples are the uninterrupted run's."""
    path = datasets["npy"]
    states, halves = [], []
    for r in range(2):
        loader, _, _ = device(path, plan(world=2, rank=r, micro=4))
        taken = [next(loader) for _ in range(5)]
        states.append(loader.state_dict())
        halves.append(taken[4][1])
        loader.close()
    assert states[0] == states[1] and states[0]["next_step"] == 5
    one, _, _ = device(path, plan(world=1, micro=8))
    one.load_state_dict({**states[0], "next_step": 4})
    ((step, batches),) = steps(one, 1)
    reference = steps(host(path, plan(world=1, micro=8))[0], 5)[4][1]
    assert step == 4 and all(same(a, b) for a, b in zip(batches, reference, strict=True))
    for m in range(2):  # the 2 ranks' slices of micro-step m, in rank order
        joined = [torch.cat([halves[0][m][k], halves[1][m][k]]) for k in range(2)]
        assert same(joined, batches[m])


def test_the_placement_line_says_which_path_and_why() -> None:
    assert place("host", 0, 0, 0, 0).line == "data: host loader (data.placement=host)"
    resident = place("auto", 38 * MiB, MiB, 1024 * MiB, 100)
    assert (resident.path, resident.line) == (
        "resident",
        "data: device-resident, 38 MiB of a 1,024 MiB budget",
    )
    streamed = place("device", 300 * MiB, 10 * MiB, 100 * MiB, 12)
    assert (streamed.path, streamed.steps_per_chunk) == ("streamed", 5)
    assert streamed.line.startswith("data: streamed in 3 chunks of 5 steps per epoch")
    too_big = place("device", 300 * MiB, 80 * MiB, 100 * MiB, 12)
    assert too_big.path == "host" and "raise data.device_budget_mib" in too_big.line
    why = "Bars has no tensors() method"
    assert place("auto", 0, 0, 0, 0, why).line == f"data: host loader ({why})"
    with pytest.raises(UserError, match="data.placement=device: Bars has no tensors"):
        place("device", 0, 0, 0, 0, why)


def test_data_over_its_budget_streams_with_the_host_loaders_batches(tmp_path) -> None:
    """64 instruments: 1.05 MiB of tables (the test period is never read) over a 1 MiB
    budget, so they stream (2 steps of 0.25 MiB per chunk), and the batches are still the
    host loader's."""
    path = write_synthetic(tmp_path / "wide", 1200, 64, "npy", chunk_len=64) and tmp_path / "wide"
    cfg = config(path, device_budget_mib=1)
    loader, _, placement = market_loaders(cfg, plan(), 64 * 3, 64, CPU, False)
    assert placement.path == "streamed" and placement.steps_per_chunk == 2
    assert placement.line == (
        "data: streamed in 26 chunks of 2 steps per epoch, at most 0.50 MiB each "
        "(1.05 MiB of tables over a 1 MiB budget)"
    )
    reference = build_loaders(cfg, plan(), 64 * 3, 64, False)[0]
    assert same_steps(steps(loader, STEPS), steps(reference, STEPS))


def test_placement_settings_are_checked() -> None:
    model = TimeSeriesConfig(num_series=48, num_targets=16)
    bad = DataConfig(kind="returns", placement="gpu", device_budget_mib=0)
    lines = problems(bad, model)
    assert "data.placement=gpu: unknown; allowed: auto, device, host" in lines
    assert any(line.startswith("data.device_budget_mib=0: must be >= 1") for line in lines)


def job_data(*overrides: str):
    return to_job(compose_raw(["model=ts_transformer", "data=dataset", *overrides])).data


ARRAYS = [
    "data._target_=userpkg.arrays.SeriesArrays",
    "+data.length=40",
    "+data.window=8",
    "+data.num_series=3",
    "+data.num_targets=2",
    "data.seq_len=8",
    "data.num_workers=0",
    "data.val_fraction=0.2",
]


def test_your_arrays_are_cut_on_the_device_as_the_host_loader_collates_them() -> None:
    p = plan(micro=4, accum=2)
    on_host, host_val, why = dataset_loaders(
        job_data(*ARRAYS, "data.placement=host"), p, CPU, False
    )
    loader, val, placement = dataset_loaders(job_data(*ARRAYS), p, CPU, False)
    assert why.path == "host" and placement.path == "resident"
    reference = steps(on_host, 6)  # 32 training items: past the first epoch
    assert same_steps(steps(loader, 6), reference)
    assert same(val.batch(0)[0], host_val.batch(0)[0])
    state = loader.state_dict()
    assert set(state) == set(on_host.state_dict())
    resumed, _, _ = dataset_loaders(job_data(*ARRAYS), p, CPU, False)
    resumed.load_state_dict({**state, "next_step": 3})
    assert same_steps(steps(resumed, 3), reference[3:])
    with pytest.raises(UserError, match="had 99 items, this one has 32"):
        resumed.load_state_dict({**state, "num_items": 99})


def test_windowed_samples_from_an_npz_live_on_the_device(tmp_path) -> None:
    rng = np.random.default_rng(0)
    npz = tmp_path / "samples.npz"
    np.savez(npz, X=rng.standard_normal((24, 8, 3)), y=rng.standard_normal(24))
    node = ["data._target_=toolkit.data.WindowedSamples", f"+data.path={npz}", "data.seq_len=8"]
    node.append("data.num_workers=0")
    p = plan(micro=4, accum=1)
    on_host, _, _ = dataset_loaders(job_data(*node, "data.placement=host"), p, CPU, False)
    loader, _, placement = dataset_loaders(job_data(*node), p, CPU, False)
    assert placement.path == "resident"
    assert same_steps(steps(loader, 4), steps(on_host, 4))


def test_a_dataset_without_tensors_stays_on_the_host() -> None:
    noisy = ["data._target_=userpkg.datasets.NoisySeries", "+data.length=16", "+data.window=8"]
    noisy += ["+data.num_series=3", "+data.num_targets=2", "data.seq_len=8", "data.num_workers=0"]
    loader, _, placement = dataset_loaders(job_data(*noisy), plan(micro=4), CPU, False)
    assert placement.line == "data: host loader (NoisySeries has no tensors() method)"
    loader.close()
    with pytest.raises(UserError, match="^data.placement=device: NoisySeries has no tensors"):
        dataset_loaders(job_data(*noisy, "data.placement=device"), plan(micro=4), CPU, False)
