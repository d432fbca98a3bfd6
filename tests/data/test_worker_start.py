"""How a loader's workers start and end, wherever the rank came from. A rank that
torch.multiprocessing.spawn started (as the benchmarks start theirs) inherits the start
method spawn; its loader's workers start by forkserver instead, because a spawned worker can
abort at close ("terminate called without an active exception": its queue's feeder thread
exits inside torch's C++ code during the interpreter's finalization)."""

from __future__ import annotations

import multiprocessing

from toolkit.data.loader import worker_start_method
from toolkit.data.tokens import BatchPlan, SyntheticTokens, TokenLoader

# Batches big enough that a worker is still handing them over when the loader closes.
PLAN = BatchPlan(seed=0, seq_len=256, micro_batch_size=64, grad_accum=4, world_size=1, rank=0)
CLOSES = 4


def open_take_close(results) -> None:
    """In a spawned process: the workers' start method, then open-take-close a few times."""
    results.put(worker_start_method(2))
    for _ in range(CLOSES):
        loader = TokenLoader(SyntheticTokens(1000), PLAN, num_workers=2, prefetch=8)
        next(loader)
        loader.close()
    results.put("closed")


def test_workers_of_a_loader_in_a_spawned_rank_start_by_forkserver_and_end_cleanly(capfd):
    spawn = multiprocessing.get_context("spawn")
    results = spawn.SimpleQueue()
    rank = spawn.Process(target=open_take_close, args=(results,))
    rank.start()
    rank.join(timeout=300)
    assert rank.exitcode == 0
    assert [results.get(), results.get()] == ["forkserver", "closed"]
    err = capfd.readouterr().err
    assert "terminate called" not in err and "killed by signal" not in err, err


def test_elsewhere_the_workers_start_as_python_starts_processes():
    assert worker_start_method(0) is None  # no workers: the loader runs in the rank
    # This test process has not changed Python's default (fork on Linux): left as it is.
    assert multiprocessing.get_start_method(allow_none=True) in (None, "fork")
    assert worker_start_method(2) is None
