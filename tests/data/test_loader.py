"""Multi-process loading: the sample order depends on neither workers nor world size;
resume is exact, also mid-epoch, with workers, and across a change of world size."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import torch

from tests.data.conftest import config
from toolkit.data.loader import SamplePlan, build_loaders

STEPS = 6


def plan(world: int = 1, rank: int = 0, micro: int = 8, accum: int = 1) -> SamplePlan:
    return SamplePlan(
        seed=11, seq_len=16, micro_batch_size=micro, grad_accum=accum, world_size=world, rank=rank
    )


def loader(path, p: SamplePlan, workers: int = 0, fmt_sample: str = "cross_section"):
    width, targets = (18, 6) if fmt_sample == "cross_section" else (3, 1)
    cfg = config(path, num_workers=workers, sample=fmt_sample)
    return build_loaders(cfg, p, width, targets, False)[0]


def take(ld, n: int) -> list:
    out = [next(ld) for _ in range(n)]
    ld.close()
    return out


def global_batch(path, world: int, micro: int, accum: int, step: int, state=None):
    """The step's samples over every rank's micro-batches, in rank-slice order."""
    rows_x, rows_y = [], []
    per_rank = []
    for r in range(world):
        ld = loader(path, plan(world, r, micro, accum))
        ld.load_state_dict(state or {"next_step": step})
        per_rank.append(next(ld)[1])
        ld.close()
    for m in range(accum):
        for r in range(world):
            rows_x.append(per_rank[r][m][0])
            rows_y.append(per_rank[r][m][1])
    return torch.cat(rows_x), torch.cat(rows_y)


def same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1].nan_to_num(7), b[1].nan_to_num(7))


@pytest.mark.parametrize("fmt", ["hdf5", "parquet", "npy"])
def test_the_order_does_not_depend_on_the_number_of_workers(datasets, fmt) -> None:
    reference = take(loader(datasets[fmt], plan(), 0), STEPS)
    for workers in (1, 4):
        got = take(loader(datasets[fmt], plan(), workers), STEPS)
        assert [s for s, _ in got] == list(range(STEPS))
        assert all(same(a[1][0], b[1][0]) for a, b in zip(got, reference, strict=True))


def test_every_format_yields_the_same_samples(datasets) -> None:
    batches = {fmt: take(loader(path, plan()), 2) for fmt, path in datasets.items()}
    assert same(batches["hdf5"][1][1][0], batches["parquet"][1][1][0])
    assert same(batches["hdf5"][1][1][0], batches["npy"][1][1][0])


def test_the_global_batch_does_not_depend_on_the_world_size(datasets) -> None:
    path = datasets["npy"]
    reference = global_batch(path, 1, 8, 1, step=3)
    assert same(global_batch(path, 2, 4, 1, step=3), reference)
    assert same(global_batch(path, 4, 1, 2, step=3), reference)


@pytest.mark.parametrize("sample", ["cross_section", "per_instrument"])
def test_resume_mid_epoch_with_workers_is_exact(datasets, sample) -> None:
    path = datasets["parquet"]
    first = loader(path, plan(), 2, sample)
    epoch_steps = first.windows.order.epoch_len // 8
    assert epoch_steps > 2 * STEPS  # the checkpoint falls mid-epoch
    before = [next(first) for _ in range(STEPS)]
    state = first.state_dict()
    first.close()
    resumed = loader(path, plan(), 2, sample)
    resumed.load_state_dict(state)
    after = take(resumed, STEPS)
    reference = take(loader(path, plan(), 0, sample), 2 * STEPS)
    assert [s for s, _ in before + after] == list(range(2 * STEPS))
    for got, want in zip(before + after, reference, strict=True):
        assert same(got[1][0], want[1][0])


def test_resume_across_the_end_of_an_epoch(datasets) -> None:
    path = datasets["npy"]
    ld = loader(path, plan())
    step = ld.windows.order.epoch_len // 8  # the batch that straddles two epochs
    reference = take(loader(path, plan()), step + 2)[step:]
    ld.load_state_dict({"next_step": step})
    got = take(ld, 2)
    assert all(same(a[1][0], b[1][0]) for a, b in zip(got, reference, strict=True))


@pytest.mark.parametrize("new_world", [1, 4])
def test_resharding_from_two_ranks_keeps_the_data_position(datasets, new_world) -> None:
    """Two ranks train 4 steps and save; the job resumes on new_world ranks with the same
    global batch: step 4's samples are those an uninterrupted run would see."""
    path = datasets["hdf5"]
    states = []
    for r in range(2):
        ld = loader(path, plan(2, r, 4), 2)
        take_some = [next(ld) for _ in range(4)]
        assert [s for s, _ in take_some] == [0, 1, 2, 3]
        states.append(ld.state_dict())
        ld.close()
    assert states[0] == states[1]
    micro = 8 // new_world
    resumed = global_batch(path, new_world, micro, 1, step=4, state=states[0])
    assert same(resumed, global_batch(path, 1, 8, 1, step=4))


def test_workers_ignore_preemption_signals_even_while_starting(datasets, monkeypatch) -> None:
    """SIGUSR2 and SIGTERM sent to the workers the moment they are forked (before they can
    have set SIG_IGN) and again later kill none of them, and the steps go on."""
    from toolkit.data import loader as loader_module

    real = loader_module._preemption_signals_blocked
    ld = loader(datasets["npy"], plan(), 2)

    def signal_workers() -> None:
        for worker in ld._iter._workers:
            os.kill(worker.pid, signal.SIGUSR2)
            os.kill(worker.pid, signal.SIGTERM)

    @contextlib.contextmanager
    def blocked_then_signalled():
        with real():
            yield
            signal_workers()  # just forked: their init may not have run yet

    monkeypatch.setattr(loader_module, "_preemption_signals_blocked", blocked_then_signalled)
    try:
        steps = [next(ld)[0] for _ in range(3)]
        signal_workers()
        time.sleep(0.2)
        assert all(w.is_alive() for w in ld._iter._workers)
        steps += [next(ld)[0] for _ in range(3)]
    finally:
        ld.close()
    assert steps == list(range(6))


def test_a_checkpoints_normalisation_scales_training_and_validation(datasets) -> None:
    train, val = build_loaders(config(datasets["npy"]), plan(), 18, 6, False)
    state = train.state_dict()
    state["normalisation"]["std"] = [2 * s for s in state["normalisation"]["std"]]
    before = val.batch(0)[0][0]
    train.load_state_dict(state)
    assert train.windows.norm.std == val.windows.norm.std == state["normalisation"]["std"]
    after = val.batch(0)[0][0]
    assert not torch.equal(before, after)


def test_a_process_that_never_closes_its_loader_still_exits(datasets) -> None:
    """Workers ignore SIGTERM, which multiprocessing's exit handler relies on; the loader
    closes itself at exit instead of leaving the process waiting on them forever."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = (
        "from tests.data.conftest import config\n"
        "from toolkit.data.loader import SamplePlan, build_loaders\n"
        f"cfg = config({str(datasets['npy'])!r}, num_workers=2)\n"
        "train, _ = build_loaders(cfg, SamplePlan(0, 16, 8, 1, 1, 0), 18, 6, False)\n"
        "kept = [train, next(train)]\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned batches need CUDA")
def test_batches_for_a_gpu_come_in_pinned_memory(datasets) -> None:
    """With pin_memory (data.pin_memory on a CUDA device) the workers' batches arrive in
    page-locked memory, so the loop's non-blocking copies overlap with compute."""
    cfg = config(datasets["npy"], num_workers=1)
    ld = build_loaders(cfg, plan(), 18, 6, True)[0]
    try:
        _, micro_batches = next(ld)
        assert all(x.is_pinned() and y.is_pinned() for x, y in micro_batches)
    finally:
        ld.close()
