"""The communication timer: clipping's all-reduce (a DTensor functional collective the
torch.distributed wrappers do not see) counted as all-reduce, on a real gloo group and a
real FSDP2 model; and the CUDA-event bookkeeping (arithmetic only: no GPU here)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from toolkit.distributed.commtime import CommTimer
from toolkit.distributed.fsdp import clip_grad_norm_


def sharded_model_with_grads() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
    fully_shard(model, mesh=mesh)
    model(torch.randn(16, 64)).square().mean().backward()
    return model


def test_clipping_all_reduce_is_counted_as_all_reduce_not_compute(single_rank_group):
    model = sharded_model_with_grads()
    timer = CommTimer().install()
    try:
        timer.take()
        clip_grad_norm_(model, 1.0)  # the old call: nothing counted
        before, exposed_before = timer.take()
        t0 = time.perf_counter()
        norm = clip_grad_norm_(model, 1.0, timer)
        clip_s = time.perf_counter() - t0
        busy, exposed = timer.take()
    finally:
        timer.uninstall()
    assert before["all_reduce"] == 0.0 and exposed_before == 0.0
    # The all-reduce column grows by the full_tensor() call: more than nothing, no more
    # than the whole clip, and all of it exposed (the thread waits for it).
    assert 0.0 < busy["all_reduce"] <= clip_s
    assert exposed == pytest.approx(busy["all_reduce"])
    assert sum(v for k, v in busy.items() if k != "all_reduce") == 0.0
    assert torch.isfinite(norm) and float(norm) > 0


class FakeEvent:
    """Stands in for torch.cuda.Event(enable_timing=True): `now` is the GPU clock (ms)."""

    now = 0.0

    def __init__(self) -> None:
        self.t: float | None = None
        self.done = True

    def record(self) -> None:
        self.t = FakeEvent.now

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return end.t - self.t


def test_cuda_event_pairs_are_resolved_at_the_step_boundary_and_kept_until_complete():
    timer = CommTimer(cuda=True, event=FakeEvent)
    with timer.span("all_reduce"):
        FakeEvent.now += 12.0  # the GPU spends 12 ms in the collective
    with timer.span("all_gather"):
        FakeEvent.now += 3.0
    late = timer._pending[-1][2]
    late.done = False  # not complete at this step's boundary
    busy, _ = timer.take()
    assert busy["all_reduce"] == pytest.approx(0.012) and busy["all_gather"] == 0.0
    late.done = True
    busy, _ = timer.take()  # counted at the next boundary, once
    assert busy["all_gather"] == pytest.approx(0.003) and busy["all_reduce"] == 0.0
    assert timer.take()[0]["all_gather"] == 0.0
