"""Trackers that catch up: what a tracker misses while its server is down waits in the run
dir (tracking/spool-<tracker>.jsonl, 0600, bounded) and is sent once the server answers
again; each kind of failure is one warning. Against a real `mlflow server` on loopback,
stopped and started again on the same port and store."""

from __future__ import annotations

import logging
import time

import pytest

from toolkit.config.tracking import TrackingConfig
from toolkit.events import Event, StepRecord
from toolkit.tracking.base import Params, TrackerSink
from toolkit.tracking.mlflow import MlflowTracker
from toolkit.tracking.spool import Spool, spool_path

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing


def record(step: int) -> StepRecord:
    return StepRecord(
        step=step, wall_time=1_700_000_000.0 + step, step_time_s=0.1, data_wait_s=0.0,
        forward_backward_s=0.1, optimizer_s=0.0, loss=10.0 / step, grad_norm=1.0, lr=1e-3,
        tokens=64, tokens_per_s=640.0, mfu=0.0, mem_peak_bytes=0, metrics={"ic": step / 100},
    )  # fmt: skip


def wait_until(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_spool_is_bounded_private_and_read_back_as_records(tmp_path):
    spool = Spool(spool_path(tmp_path, "mlflow"), max_records=3)
    dropped = spool.add([record(1), Event("eval", 1.0, 2.0, 1, attrs={"val_ic": 0.1})])
    dropped += spool.add([record(2), record(3)])
    spool.mark_unfinished()
    assert dropped == 1 and spool.count == 3
    assert spool.path.stat().st_mode & 0o777 == 0o600
    items, unfinished = Spool(spool.path, 3).read()
    assert unfinished
    assert [(type(i).__name__, i.step) for i in items] == [
        ("StepRecord", 1), ("Event", 1), ("StepRecord", 2),
    ]  # fmt: skip
    assert items[0] == record(1)  # the user's own series (metrics) too
    spool.clear()
    assert not spool.path.exists()


@pytest.mark.slow
def test_records_missed_while_the_server_was_down_arrive_when_it_is_back(
    tmp_path, mlflow_server_factory, caplog
):
    from mlflow.tracking import MlflowClient

    server = mlflow_server_factory()
    port = int(server.uri.rsplit(":", 1)[1])
    cfg = TrackingConfig(mlflow=True, mlflow_tracking_uri=server.uri, experiment="catch-up")
    cfg.mlflow_request_timeout_s, cfg.mlflow_request_retries = 2.0, 0
    tracker = MlflowTracker(cfg, tmp_path)
    spool = Spool(spool_path(tmp_path, "mlflow"), 1000)
    sink = TrackerSink(tracker, Params({}, [], "catch-up"), 1000, 100, 30.0, 0.0, spool, 0.2)
    client = MlflowClient(tracking_uri=server.uri)

    def logged() -> set[int]:
        return {m.step for m in client.get_metric_history(tracker.run_id, "train/loss")}

    with caplog.at_level(logging.WARNING, logger="toolkit.tracking.base"):
        for step in range(1, 6):
            sink.write_step(record(step))
        wait_until(lambda: tracker.run_id is not None and logged() == set(range(1, 6)), "1-5")

        server.kill()  # down: steps 6-10 wait in the spool
        for step in range(6, 11):
            sink.write_step(record(step))
        wait_until(lambda: spool.count == 5, "steps 6-10 in the spool")

        server = mlflow_server_factory(port=port)  # back, same store
        for step in range(11, 16):
            sink.write_step(record(step))
        sink.close()

    client = MlflowClient(tracking_uri=server.uri)
    assert logged() == set(range(1, 16))
    history = {m.step: m.value for m in client.get_metric_history(tracker.run_id, "train/ic")}
    assert history == pytest.approx({s: s / 100 for s in range(1, 16)})  # your own series
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    assert not spool.path.exists() and sink.dropped == 0
    record_ = sink.record()
    assert record_["spooled"] == 0 and not record_["unfinished"]
    warnings = [r.getMessage() for r in caplog.records if "tracking: mlflow:" in r.getMessage()]
    # One line per kind of failure: the server went away once, it was said once.
    assert len(warnings) == len(record_["errors"]) >= 1, warnings
    assert len({w.split(":")[2] for w in warnings}) == len(warnings)
