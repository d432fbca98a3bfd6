"""A model of yours has a launch floor too: counting sees the aten ops of its forward and
backward, and the performance model charges each its per-op cost (toolkit.perfmodel.
counted_model); no term of its step is ever negative; and a model far too small for its
ranks is diagnosed as such (toolkit.telemetry.report.verdict.too_small)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys

import numpy as np
import pytest
import torch

from tests.conftest import REPO, run_module
from toolkit.config.hardware import HardwareConfig
from toolkit.config.telemetry import ReportConfig
from toolkit.perfmodel.counted import OpCounter
from toolkit.perfmodel.counted_model import (
    BLOCK_ATEN_OPS,
    CountedShape,
    aten_op_s,
    predict_counted,
)
from toolkit.perfmodel.layout import Layout
from toolkit.perfmodel.small import packed_time
from toolkit.perfmodel.split import predicted_split
from toolkit.runmodel import RunModelUnreadable, from_dict
from toolkit.telemetry.report.analysis import Attribution, RankSeries
from toolkit.telemetry.report.verdict import diagnose, summary_lines

sys.path.insert(0, str(REPO / "tests" / "fixtures"))

from userpkg.counted_models import lstm_workload, tcn_workload  # noqa: E402

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

HW = HardwareConfig(
    peak_flops_fp32=1.0e12,
    memory_bandwidth=1.0e10,
    elementwise_fraction=0.5,
    op_overhead_s=1.0e-5,
    optimizer_op_overhead_s=5.0e-6,
    fsdp_collective_overhead_s=1.0e-4,
)


def test_the_aten_op_cost_is_the_profiles_kernel_cost_over_the_blocks_aten_ops():
    """The profile times the built-in block at dim 8 (toolkit.measure.hardware.op_overhead)
    per kernel; BLOCK_ATEN_OPS is what the counter counts of the same forward + backward."""
    from toolkit.train.models.blocks import Block

    with torch.device("meta"):
        block = Block(8, 1, 4.0, 1e-5)
        x = torch.randn(1, 1, 8, requires_grad=True)
    with OpCounter() as ops:
        block(x).sum().backward()
    assert ops.count == BLOCK_ATEN_OPS
    assert aten_op_s(HW) == pytest.approx(1.0e-5 * 19 * 3 / BLOCK_ATEN_OPS)


def test_a_small_lstm_counts_the_ops_eager_runs_not_its_composite_form_on_meta():
    """On meta nn.LSTM runs per gate and time step (about a thousand ops over 8 steps); on the
    CPU, as eager trains it, one fused kernel: the count is the CPU's."""
    work = lstm_workload(batch=2, time=8)
    assert work.count().ops < 100
    meta_batch = torch.zeros(2, 8, 48, device="meta"), torch.zeros(2, 16, device="meta")
    with_meta_batch = dataclasses.replace(work, batch=meta_batch)  # cannot run on the CPU
    assert with_meta_batch.count().ops > 500  # the meta count, an upper bound


@pytest.fixture(scope="module")
def tcn() -> CountedShape:
    cost = tcn_workload(batch=4, time=32).count()
    return CountedShape(
        name="TCN",
        flops_per_sample=cost.flops_per_sample,
        forward_flops_per_sample=cost.forward_flops_per_sample,
        num_params=cost.num_params,
        saved_bytes_per_sample=cost.saved_bytes_per_sample,
        units=5,
        ops_per_micro_step=cost.ops,
        param_tensors=cost.param_tensors,
    )


def layout(**kw) -> Layout:
    base = dict(world_size=1, ranks_per_node=1, micro_batch_size=4, grad_accum=1, seq_len=32)
    return Layout(**{**base, **kw})


def test_counted_ops_make_a_launch_floor(tcn):
    # 4 convolutions + head (10 tensors): forward + backward dispatch dozens of aten ops.
    assert tcn.param_tensors == 10 and tcn.ops_per_micro_step > 40
    t = predict_counted(tcn, layout(grad_accum=2), HW).time
    per_op = 2 * tcn.ops_per_micro_step * aten_op_s(HW)
    assert t["overhead_s"] == pytest.approx(per_op + t["fsdp_overhead_s"])
    # FSDP2: 6 units gathered once and reduced each of the 2 micro-steps, 4 blocks re-gathered.
    assert t["fsdp_overhead_s"] == pytest.approx((6 + 2 * 4 + 2 * 6) * 1.0e-4)
    assert t["launches"] == 2 * tcn.ops_per_micro_step + 13 * 10  # + foreach clip and AdamW
    assert t["optimizer_launch_s"] == pytest.approx(13 * 10 * 5.0e-6)
    assert t["dominant"] == "overhead"  # a tiny model: its floor, not its arithmetic
    uncounted = dataclasses.replace(tcn, ops_per_micro_step=0)  # an older model.json
    assert predict_counted(uncounted, layout(grad_accum=2), HW).step_s < t["step_s"]


def test_no_term_of_a_counted_step_is_negative(tcn):
    """Over worlds, accumulation, checkpointing and ensembles: the step's terms and the
    report's split of them (the optimizer without the small all-reduces) are >= 0."""
    for world, accum, ac, k in itertools.product((1, 2, 8), (1, 4), (False, True), (1, 8)):
        lay = layout(world_size=world, ranks_per_node=min(world, 4), grad_accum=accum)
        lay = dataclasses.replace(lay, activation_checkpointing=ac)
        time = packed_time(predict_counted(tcn, lay, HW).time, k)
        where = f"world {world}, grad_accum {accum}, checkpointing {ac}, ensemble {k}"
        terms = {n: v for n, v in time.items() if n.endswith("_s") and isinstance(v, float)}
        negative = {n: v for n, v in terms.items() if v < 0}
        assert not negative, where
        split = predicted_split(time)
        assert min(split.values()) >= 0, (where, split)
        assert split["optimizer"] > 0, where


def test_an_older_model_json_without_ops_reads_as_not_counted():
    record = {
        "name": "TCN",
        "unit": "samples",
        "flops_per_sample": 1.0,
        "forward_flops_per_sample": 0.5,
        "num_params": 10,
        "param_bytes": 40,
        "tokens_per_sample": 0,
        "saved_bytes_per_sample": 0.0,
        "units": 1,
        "ensemble": 1,
    }
    model = from_dict(record)
    assert model.ops_per_micro_step == 0 and model.param_tensors == 0
    assert from_dict({**record, "ops_per_micro_step": 68}).ops_per_micro_step == 68
    with pytest.raises(RunModelUnreadable, match="ops_per_micro_step=-1"):
        from_dict({**record, "ops_per_micro_step": -1})


def ranks(n: int, step_s: float) -> dict[int, RankSeries]:
    steps = 20
    out = {}
    for r in range(n):
        step = np.full(steps, step_s)
        out[r] = RankSeries(
            rank=r,
            node="n0",
            columns={
                "step": np.arange(1, steps + 1),
                "wall_time": 1000.0 + np.cumsum(step),
                "step_time_s": step,
            },
            attempt=np.zeros(steps, dtype=int),
            node_of_row=np.full(steps, "n0", dtype=object),
            warmup=np.zeros(steps, dtype=bool),
        )
    return out


def verdict_lines(arithmetic_s: float, communication_s: float, **trainer: int) -> list[str]:
    from toolkit.config.trainer import TrainerConfig

    config = TrainerConfig(**{"micro_batch_size": 16, **trainer})
    job = type("Job", (), {"trainer": config, "parallel": None})()
    verdict = diagnose(
        series=ranks(2, 0.020),
        attribution=Attribution({"compute": 0.8, "communication": communication_s}),
        gaps=[],
        gpus=[],
        events=[],
        cfg=ReportConfig(sacct=False),
        job=job,
        predicted={"step": 0.002, "compute": 0.0015, "arithmetic": arithmetic_s},
        terms={"step": 0.020},
    )
    return summary_lines(verdict)


def test_a_model_too_small_for_its_ranks_is_diagnosed_as_such():
    # 0.18 ms of arithmetic in a 20 ms step on 2 ranks, a third of it in collectives.
    text = "\n".join(verdict_lines(0.00018, 0.4))
    assert "the model is too small for its 2 ranks: its arithmetic is 0.18 ms of a 20.0 ms" in text
    assert "run on fewer ranks, raise the micro-batch (trainer.micro_batch_size=32)" in text
    assert "trainer.ensemble=32" in text  # 20 ms / 0.18 ms, at most 32
    assert "reshard_after_forward" not in text
    # Without much communication it is still said, as its own finding.
    assert "too small for its 2 ranks" in "\n".join(verdict_lines(0.00018, 0.0))
    # Where the global batch is set, the micro-batch follows it: that is what to raise.
    by_global = "\n".join(verdict_lines(0.00018, 0.4, global_batch_size=32))
    assert "raise the micro-batch (trainer.global_batch_size=64)" in by_global
    # A model whose arithmetic is most of the step is not.
    assert "too small" not in "\n".join(verdict_lines(0.015, 0.4))


@pytest.mark.slow
def test_plan_check_runs_a_user_model_and_compares_prediction_and_measurement():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests/fixtures")]))
    tcn = [
        "model._target_=userpkg.sweep_models.TinyTCN",
        "model.num_series=4",
        "model.num_targets=2",
        "model.channels=8",
        "model.num_layers=2",
        "data=dataset",
        "data._target_=userpkg.datasets.NoisySeries",
        "+data.length=256",
        "+data.window=16",
        "+data.num_series=4",
        "+data.num_targets=2",
        "+data.seq_len=16",
        "+data.num_workers=0",
        "trainer.global_batch_size=8",
        "cluster.tasks_per_node=1",
    ]
    done = run_module("toolkit.plan", *tcn, "--check", "1", "--steps", "2", env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("1 |")]
    predicted, measured, ratio = (float(v.replace(",", "")) for v in row.split("|")[2:5])
    assert predicted > 0 and measured > 0 and ratio == pytest.approx(measured / predicted, 0.05)
