"""A tracker that is slow never slows training: in process, the MLflow tracker pointed at
a real loopback server that accepts connections and never answers. Writes return at once,
a full queue drops and counts, and close() gives up after close_timeout_s."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from toolkit.config.tracking import TrackingConfig, problems
from toolkit.events import Event, StepRecord
from toolkit.tracking.base import Params, TrackerSink
from toolkit.tracking.mlflow import MlflowTracker

pytest.importorskip("mlflow")


@pytest.fixture
def silent_server():
    """Accepts TCP connections on 127.0.0.1 and never answers them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def record(step: int) -> StepRecord:
    return StepRecord(step, time.time(), 0.1, 0.0, 0.05, 0.05, 2.0, 1.0, 1e-3, 64, 640.0, 0.01, 0)


def test_a_silent_server_costs_training_nothing_and_loses_counted_records(tmp_path, silent_server):
    cfg = TrackingConfig(
        mlflow=True,
        mlflow_tracking_uri=silent_server,
        mlflow_request_timeout_s=30,
        mlflow_request_retries=0,
        queue_size=10,
        close_timeout_s=1.0,
    )
    sink = TrackerSink(MlflowTracker(cfg, tmp_path), Params({}, [], "run"), 10, 5, 1.0)
    started = time.perf_counter()
    for step in range(1, 51):
        sink.write_step(record(step))
    sink.write_event(Event("checkpoint", 0.0, 1.0, 50))
    assert time.perf_counter() - started < 0.5  # 51 writes, none waiting for the server

    started = time.perf_counter()
    result = sink.close()
    assert time.perf_counter() - started < 3.0  # close_timeout_s, not the request timeout
    assert result["dropped"] == 51  # queue full (41) and the 10 left when close gave up
    assert "did not finish within 1 s" in result["error"]


def test_a_password_in_the_tracking_uri_is_refused():
    found = problems(TrackingConfig(mlflow_tracking_uri="https://me:hunter2@mlflow.corp"))
    assert len(found) == 1 and "MLFLOW_TRACKING_PASSWORD" in found[0]
    assert "hunter2" not in found[0]
    assert problems(TrackingConfig(mlflow_tracking_uri="https://mlflow.corp")) == []


def test_without_a_tracking_uri_the_store_and_its_artifacts_stay_in_the_run_dir(
    tmp_path, monkeypatch
):
    """No URI given: the SQLite store is RUN_DIR/tracking/mlflow.db and the artifacts go to
    RUN_DIR/tracking/mlartifacts, not to ./mlruns wherever the rank was started."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    run_dir = tmp_path / "run"
    (run_dir / "tracking").mkdir(parents=True)
    summary = run_dir / "summary.json"
    summary.write_text("{}")
    tracker = MlflowTracker(TrackingConfig(mlflow=True), run_dir)
    tracker.open(Params({"seed": 1}, [], "run"))
    tracker.finish([summary])
    assert not (cwd / "mlruns").exists()
    assert (run_dir / "tracking" / "mlflow.db").is_file()
    stored = list((run_dir / "tracking" / "mlartifacts").rglob("summary.json"))
    assert len(stored) == 1, stored
    client = MlflowClient(tracking_uri=tracker.uri)
    assert [a.path for a in client.list_artifacts(tracker.run_id)] == ["summary.json"]
