"""The training loop's injected faults, one rank at a time (no process group needed): each fires
only on its rank or node and step, and a hang is injected in the job's first attempt only.
End to end they run in tests/train/test_training.py (fail_at_step), tests/telemetry/
test_hang_watchdog.py (hangs), test_profiling.py (slow loader, straggler) and the Slurm tests."""

from __future__ import annotations

import time

import pytest

from toolkit.config.fault import FaultConfig
from toolkit.train.faults import FaultInjector


def test_a_failure_fires_on_its_rank_at_its_step_only() -> None:
    fault = FaultConfig(fail_at_step=3, fail_rank=1)
    FaultInjector(fault, rank=0, node="n1").step_start(2)  # step 3 on another rank
    crashing = FaultInjector(fault, rank=1, node="n1")
    crashing.step_start(1)  # step 2
    with pytest.raises(RuntimeError, match=r"^injected failure at step 3 \(fault.fail_at_step\)$"):
        crashing.step_start(2)  # 2 steps done: step 3 runs


def test_a_bad_node_fails_every_rank_on_it_at_the_first_step_by_default() -> None:
    fault = FaultConfig(fail_node="n2")
    FaultInjector(fault, rank=0, node="n1").step_start(0)
    with pytest.raises(RuntimeError, match="uncorrectable ECC error .* node n2 at step 1"):
        FaultInjector(fault, rank=1, node="n2").step_start(0)
    FaultInjector(fault, rank=1, node="n2").step_start(1)  # only at that step
    at_step = FaultConfig(fail_node="n2", fail_at_step=5, fail_rank=0)
    FaultInjector(at_step, rank=0, node="n1").step_start(4)  # fail_node wins over fail_rank
    with pytest.raises(RuntimeError, match="at step 5: fault.fail_node"):
        FaultInjector(at_step, rank=3, node="n2").step_start(4)


def test_only_the_straggler_rank_sleeps_in_compute() -> None:
    fault = FaultConfig(straggler_rank=1, straggler_sleep_s=0.2)
    fast, slow = FaultInjector(fault, rank=0, node="n1"), FaultInjector(fault, rank=1, node="n1")
    t0 = time.perf_counter()
    fast.compute()
    t1 = time.perf_counter()
    slow.compute()
    t2 = time.perf_counter()
    assert t1 - t0 < 0.1 and t2 - t1 >= 0.2


def test_a_slow_loader_sleeps_in_the_data_wait_on_every_rank() -> None:
    injector = FaultInjector(FaultConfig(data_delay_s=0.2), rank=3, node="n1")
    t0 = time.perf_counter()
    injector.data_wait()
    assert time.perf_counter() - t0 >= 0.2


@pytest.mark.parametrize(
    ("restarts", "armed"), [(None, "collective"), ("0", "collective"), ("1", None)]
)
def test_a_hang_is_armed_on_its_rank_in_the_first_attempt_only(
    monkeypatch, restarts, armed
) -> None:
    if restarts is None:
        monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    else:
        monkeypatch.setenv("SLURM_RESTART_COUNT", restarts)
    fault = FaultConfig(hang_at_step=3, hang_rank=1)
    assert FaultInjector(fault, rank=1, node="n1").hang_where == armed
    assert FaultInjector(fault, rank=0, node="n1").hang_where is None
    # Armed or not, nothing blocks at other steps (a hang itself: test_hang_watchdog.py).
    hanging = FaultInjector(fault, rank=1, node="n1")
    for step in (0, 1, 2, 4):
        hanging.before_all_reduce(step)
        hanging.step_start(step)


def test_the_node_is_slurms_name_for_it(monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    assert FaultInjector(FaultConfig(), rank=0).node == "n7"
