"""Quant data details: windows that span a gap in time (overnight, weekend, halt) are not
drawn unless asked (data.max_gap), on the host and the device path alike and across a
resume; a duplicate (time, instrument) row is named in prepare's refusal (docs/data.md)."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet
import pytest
import torch

from tests.data.conftest import config
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.validate import problems
from toolkit.data.device import market_loaders
from toolkit.data.loader import SamplePlan, build_loaders, market_windows
from toolkit.data.manifest import DataError
from toolkit.data.prepare import prepare
from toolkit.data.samples import SampleSpec, gap_free, max_gap_of
from toolkit.data.training import prepare as prepare_training
from toolkit.data.writer import write_dataset

MINUTE = 60 * 10**9  # the time index of timestamps: nanoseconds
HALT = 100  # the time step after which trading stopped for an hour


@pytest.fixture(scope="module")
def halted(tmp_path_factory):
    """300 minute bars of 4 instruments with an hour's halt between steps 99 and 100."""
    rng = np.random.default_rng(5)
    values = rng.standard_normal((300, 4, 2)).astype(np.float32)
    times = np.arange(300, dtype=np.int64) * MINUTE
    times[HALT:] += 60 * MINUTE
    out = tmp_path_factory.mktemp("halted") / "data"
    mask = np.ones_like(values, np.uint8)
    write_dataset(out, values, mask, times, list("ABCD"), ["ret", "x"], time_unit="ns")
    return out


def plan(world: int = 1, rank: int = 0) -> SamplePlan:
    return SamplePlan(
        seed=4, seq_len=16, micro_batch_size=8 // world, grad_accum=1, world_size=world, rank=rank
    )


def test_a_window_is_drawn_only_when_it_spans_no_gap_longer_than_max_gap():
    """lookback 4 + horizon 2: anchor t reads steps t-3..t+2, so anchors 98..102 span the
    gap between steps 99 and 100."""
    times = np.r_[np.arange(100), np.arange(100, 200) + 60]
    spec = SampleSpec(lookback=4, horizon=2, mode="cross_section", target=0)
    kept = gap_free(range(3, 198), times, spec, max_gap=30.0)
    assert sorted(set(range(3, 198)) - set(kept.tolist())) == [98, 99, 100, 101, 102]
    assert len(gap_free(range(3, 198), times, spec, max_gap=None)) == 195


def test_auto_leaves_out_the_halt_and_null_draws_every_window(halted):
    auto = market_windows(config(halted, seq_len=16), plan(), 0, 0)[0]
    every = market_windows(config(halted, seq_len=16, max_gap=None), plan(), 0, 0)[0]
    # Training steps 0..205: anchors 15..203 (lookback 16, horizon 2); 98..114 span the halt.
    assert every.anchors.tolist() == list(range(15, 204))
    assert auto.anchors.tolist() == [*range(15, 98), *range(115, 204)]
    assert auto.order.num_anchors == len(auto.anchors)
    ids = auto.order.ids(0, 10 * auto.order.epoch_len)
    assert not set(auto.anchors[ids].tolist()) & set(range(98, 115))
    # The halt: 61 minutes between two steps, 61 median steps; as a number, nanoseconds.
    for limit, anchors in (("61x", 189), ("60x", 172), ("2h", 189), ("61min", 189)):
        cfg = config(halted, seq_len=16, max_gap=limit)
        assert market_windows(cfg, plan(), 0, 0)[0].order.num_anchors == anchors, limit
    for limit, anchors in (("30min", 172), (str(60 * MINUTE), 172), (str(61 * MINUTE), 189)):
        cfg = config(halted, seq_len=16, max_gap=limit)
        assert market_windows(cfg, plan(), 0, 0)[0].order.num_anchors == anchors, limit


def test_the_host_and_device_paths_cut_the_same_gap_free_batches_and_resume_exactly(halted):
    cfg = config(halted, seq_len=16, num_workers=0)
    host = build_loaders(cfg, plan(), 8, 4, False)[0]
    want = [next(host)[1] for _ in range(30)]  # 240 samples: past the first epoch (172)
    host.close()
    assert host.epoch == 1  # step 29 starts at sample 232
    dev = market_loaders(cfg, plan(), 8, 4, torch.device("cpu"), False)[0]
    for step in range(3):
        for a, b in zip(next(dev)[1], want[step], strict=True):
            assert all(
                torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0)) for x, y in zip(a, b, strict=True)
            )
    state = dev.state_dict()
    dev.close()
    assert dev.epoch == 0
    for rank in range(2):  # the device path's checkpoint, resumed by the host on two ranks
        resumed = build_loaders(cfg, plan(2, rank), 8, 4, False)[0]
        resumed.load_state_dict(state)
        for step in range(3, 30):
            got = next(resumed)[1][0]
            half = slice(4 * rank, 4 * rank + 4)
            assert torch.equal(got[0], want[step][0][0][half])
        resumed.close()
        assert resumed.epoch == 1


def test_the_launcher_says_how_many_windows_the_gaps_leave_out(halted, caplog):
    caplog.set_level(logging.INFO, "toolkit.data.training")
    prepare_training(config(halted, seq_len=16), 0)
    assert "data: 17 of 189 train windows span a gap in time longer than data.max_gap=auto" in (
        caplog.text
    )


def test_max_gap_is_validated_and_a_split_left_without_windows_is_one_line(halted):
    job = to_job(compose_raw(["model=ts_transformer", "data=returns", "data.max_gap=soon"]))
    assert any(p.startswith("data.max_gap='soon': not a gap; use auto") for p in problems(job))
    with pytest.raises(
        DataError, match=r"^data.max_gap=1: every window of the test period \(lookback 16"
    ):
        market_windows(config(halted, max_gap="1"), plan(), 0, 0)


def test_prepare_records_the_time_unit_that_durations_need(tmp_path):
    """Timestamps are nanoseconds, dates days, integers have no unit: a duration as
    data.max_gap on those is one line asking for a number or a multiple."""
    for times, unit in (
        (np.array(["2024-01-02T09:30", "2024-01-02T09:31"], dtype="datetime64[ns]"), "ns"),
        (np.array(["2024-01-02", "2024-01-03"], dtype="datetime64[D]"), "day"),
        (np.array([7, 8]), None),
    ):
        source, out = tmp_path / f"{unit}.parquet", tmp_path / f"{unit}-data"
        table = pa.table({"time": pa.array(times), "instrument": ["A", "A"], "ret": [0.1, 0.2]})
        pa.parquet.write_table(table, source)
        manifest = prepare(source, out)
        assert manifest.time_unit == unit
    assert max_gap_of("16h", times, "ns") == 16 * 60 * MINUTE
    assert max_gap_of("3d", times, "day") == 3
    with pytest.raises(DataError, match=r"^data.max_gap=16h: a duration, and this dataset's"):
        max_gap_of("16h", times, manifest.time_unit)


def test_a_duplicate_time_and_instrument_is_named_with_its_rows(tmp_path):
    table = pa.table(
        {
            "time": pa.array(
                np.array(
                    ["2024-01-02T09:30", "2024-01-02T09:31"] * 2 + ["2024-01-02T09:31"],
                    dtype="datetime64[ns]",
                )
            ),
            "instrument": ["A", "A", "B", "B", "A"],
            "ret": [0.1, 0.2, 0.3, 0.4, 0.5],
        }
    )
    pcsv.write_csv(table, tmp_path / "bars.csv")
    with pytest.raises(DataError) as caught:
        prepare(tmp_path / "bars.csv", tmp_path / "out")
    assert str(caught.value) == (
        f"{tmp_path / 'bars.csv'}: 1 duplicate (time, instrument) row(s), the first is time "
        "2024-01-02 09:31:00, instrument 'A' at data rows 2, 5; keep one row per time and "
        "instrument"
    )
