"""Your own series (a callback's step_metrics, session.log's other names) reach the
trackers as train/<name> beside the step's fields: read back with TensorBoard's reader."""

from __future__ import annotations

import json

import pytest

from tests.test_session import launched  # noqa: F401 - the fixture: a script's rank 1
from toolkit import session
from toolkit.events import StepRecord
from toolkit.tracking.base import Params, TrackerSink
from toolkit.tracking.tensorboard import TensorBoardTracker

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing


def test_a_records_own_series_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(tmp_path / "tb")
    sink = TrackerSink(tracker, Params({}, [], "series"), 100, 10, 30.0)
    for step in (1, 2, 3):
        sink.write_step(
            StepRecord(
                step=step, wall_time=100.0 + step, step_time_s=0.1, data_wait_s=0.0,
                forward_backward_s=0.1, optimizer_s=0.0, loss=1.0 / step, grad_norm=1.0,
                lr=1e-3, tokens=0, tokens_per_s=0.0, mfu=0.0, mem_peak_bytes=0,
                metrics={"ic": 0.1 * step},
            )
        )  # fmt: skip
    assert sink.close()["dropped"] == 0
    tb = EventAccumulator(str(tmp_path / "tb")).Reload()
    ic = {e.step: e.value for e in tb.Scalars("train/ic")}
    assert ic == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})
    assert "train/attempt" not in tb.Tags()["scalars"]  # the attempt is no series


def test_session_log_keeps_your_names_as_the_records_series(launched):  # noqa: F811
    session.log(1, loss=0.5, ic=0.25)
    (line,) = [json.loads(x) for x in launched.open()]
    assert line["ic"] == 0.25 and line["attempt"] == 0 and "metrics" not in line


def test_a_callback_value_that_is_no_number_is_left_out_with_one_warning(caplog):
    import torch

    from toolkit.hooks import Hook, step_metrics

    class Stats(Hook):
        def step_metrics(self, trainer, batch):
            return {"ic": torch.tensor([0.5]), "label": "warmup", "rows": len(batch)}

    with caplog.at_level("WARNING", logger="toolkit.hooks"):
        first = step_metrics([Stats(), Hook()], trainer=None, batch=[1, 2])
        again = step_metrics([Stats()], trainer=None, batch=[1])
    assert first == {"ic": 0.5, "rows": 2.0} and again == {"ic": 0.5, "rows": 1.0}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "Stats.step_metrics: label='warmup' is not a number" in said[0]
