"""The report's arithmetic on hand-made numbers."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.config.telemetry import ReportConfig
from toolkit.telemetry.report.analysis import (
    RankSeries,
    attribute_time,
    blocking_span,
    find_idle_gaps,
    find_stragglers,
    is_blocking_checkpoint,
)


def ev(name: str, start: float, end: float, rank: int = 0, **attrs) -> dict:
    return {"name": name, "start": start, "end": end, "rank": rank, "attrs": attrs, "step": -1}


@pytest.mark.parametrize(
    "event, blocking",
    [
        (ev("checkpoint", 0, 1), True),
        (ev("checkpoint", 0, 1, phase="staging"), True),
        (ev("checkpoint", 0, 1, phase="stall"), True),
        (ev("checkpoint", 0, 1, phase="write"), False),
        (ev("checkpoint_background_write", 0, 1), False),
        (ev("eval", 0, 1), False),
        (ev("checkpoint", 0, 30, stall_s=0.8, write_s=29.0, **{"async": True}), True),
        (ev("checkpoint", 0, 30, stall_s=0.0, **{"async": True}), False),
    ],
)
def test_which_checkpoint_events_stall_training(event, blocking):
    assert is_blocking_checkpoint(event) is blocking


def test_an_async_checkpoint_stalls_only_for_its_stall_s():
    """The checkpoint component's event spans staging and the background write."""
    event = ev("checkpoint", 100.0, 130.0, stall_s=0.8, staging_s=0.7, write_s=29.0)
    assert blocking_span(event) == (100.0, 100.8)


def series(
    rank: int,
    step_s: list[float],
    node: str = "n0",
    gap_after: int | None = None,
    gap_s: float = 0.0,
    data_wait_s: float = 0.0,
) -> RankSeries:
    n = len(step_s)
    step = np.asarray(step_s, dtype=float)
    ends = np.cumsum(step)
    if gap_after is not None:
        ends[gap_after:] += gap_s
    return RankSeries(
        rank=rank,
        node=node,
        columns={
            "step": np.arange(1, n + 1),
            "wall_time": 1000.0 + ends,
            "step_time_s": step,
            "data_wait_s": np.full(n, data_wait_s),
        },
        attempt=np.zeros(n, dtype=int),
        node_of_row=np.full(n, node, dtype=object),
        warmup=np.zeros(n, dtype=bool),
    )


def test_a_rank_ten_percent_slower_on_most_steps_is_a_straggler():
    steps = {r: series(r, [1.0] * 20) for r in range(4)}
    steps[2] = series(2, [1.1] * 15 + [1.0] * 5)
    (found,) = find_stragglers(steps, ReportConfig())
    assert found.who == "rank 2 (n0)" and found.score == pytest.approx(0.1)
    assert found.persistence == pytest.approx(0.75)


def test_a_rank_slow_on_a_few_steps_only_is_not_a_straggler():
    steps = {r: series(r, [1.0] * 20) for r in range(4)}
    steps[2] = series(2, [2.0] * 4 + [1.0] * 16)
    assert find_stragglers(steps, ReportConfig()) == []


def test_an_idle_gap_is_explained_by_the_checkpoint_that_covers_it():
    steps = {r: series(r, [1.0] * 10, gap_after=5, gap_s=30.0) for r in range(2)}
    events = [ev("checkpoint", 1005.0, 1034.0, rank=r, phase="stall") for r in range(2)]
    (gap,) = find_idle_gaps(steps, events, ReportConfig())
    assert gap.duration_s == pytest.approx(30.0) and gap.ranks == [0, 1]
    assert gap.explanation.startswith("checkpoint")
    (unexplained,) = find_idle_gaps(steps, [], ReportConfig())
    assert unexplained.explanation == "unexplained"


def test_time_attribution_adds_up_to_each_ranks_wall_time():
    steps = {0: series(0, [1.0] * 10, gap_after=5, gap_s=20.0, data_wait_s=0.25)}
    events = [ev("checkpoint", 1005.0, 1013.0, phase="stall"), ev("eval", 1013.0, 1015.0)]
    seconds = attribute_time(steps, events).seconds
    assert seconds == pytest.approx(
        {
            "compute": 7.5,
            "data_wait": 2.5,
            "checkpoint_stall": 8.0,
            "eval": 2.0,
            "idle_other": 10.0,
            "restart_downtime": 0.0,
        }
    )
