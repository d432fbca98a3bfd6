"""The performance model and the planner for a model of yours, from its counted costs."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO, run_module
from toolkit.config.hardware import HardwareConfig
from toolkit.perfmodel.counted_model import CountedShape, matmul_rate, predict_counted
from toolkit.perfmodel.layout import Layout

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

SHAPE = CountedShape(
    name="lstm",
    flops_per_sample=6.0e6,
    forward_flops_per_sample=2.0e6,
    num_params=1000,
    saved_bytes_per_sample=4096.0,
    units=2,
)
HW = HardwareConfig(peak_flops_fp32=1.0e9, memory_bandwidth=1.0e9, elementwise_fraction=0.5)


def layout(**kw) -> Layout:
    base = dict(world_size=2, ranks_per_node=2, micro_batch_size=4, grad_accum=1, seq_len=16)
    return Layout(**{**base, **kw})


def test_counted_terms_by_hand():
    p = predict_counted(SHAPE, layout(), HW)
    # 4 samples x 6 MFLOP at 1 GFLOP/s (no measured fractions: the nominal peak)
    assert p.time["gemm_s"] == pytest.approx(4 * 6.0e6 / 1.0e9)
    # saved activations written in forward and read in backward, at half the bandwidth
    assert p.time["elementwise_s"] == pytest.approx(2 * 4 * 4096 / (1.0e9 * 0.5))
    assert p.flops["model_flops_per_step"] == 6.0e6 * 4 * 2  # both ranks' samples
    m = p.memory
    assert m["params_bytes"] == 1000 * 4 / 2  # fp32 shard over 2 ranks
    assert m["optimizer_bytes"] == 8 * 1000 / 2  # AdamW: two fp32 states
    assert m["activations_bytes"] == 4 * 4096
    assert m["allgather_bytes"] == 2 * 500 * 4  # two gathered units of 500 parameters
    recomputed = predict_counted(SHAPE, layout(activation_checkpointing=True), HW)
    assert recomputed.time["gemm_s"] == pytest.approx(4 * 8.0e6 / 1.0e9)  # forward again
    assert recomputed.memory["activations_bytes"] == 2 * 4 * 4096 / 2


def test_the_matmul_rate_is_the_profiles_median_fraction():
    from toolkit.config.hardware import GemmPoint

    hw = HardwareConfig(
        peak_flops_fp32=1.0e9,
        matmul=[GemmPoint(8, 8, 8, "float32", f) for f in (0.2, 0.5, 0.9)],
    )
    assert matmul_rate(hw, "float32") == pytest.approx(0.5e9)


@pytest.fixture(scope="module")
def user_env() -> dict[str, str]:
    paths = [str(REPO), str(REPO / "tests" / "fixtures")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


LSTM = [
    "model._target_=userpkg.models.LSTMForecaster",
    "model.num_series=48",
    "model.num_targets=16",
    "data=returns",
    "data.seq_len=32",
]


@pytest.mark.slow
def test_perfmodel_predicts_a_user_model_from_its_counted_costs(user_env):
    done = run_module("toolkit.perfmodel", "--json", *LSTM, env=user_env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    p = json.loads(done.stdout)
    assert p["time"]["counted"] is True and p["time"]["step_s"] > 0
    assert p["flops"]["flops_per_sample"] > 0 and p["fits"]


@pytest.mark.slow
def test_the_planner_offers_a_user_model_only_the_layouts_its_spec_runs(user_env):
    done = run_module(
        "toolkit.plan", *LSTM, "cluster.tasks_per_node=4", "--top", "50", env=user_env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if "parallel.tp=" in line]
    assert rows, done.stdout
    assert all("parallel.tp=1 " in r and "parallel.pp=1 " in r for r in rows)
