"""tracking=mlflow against a real `mlflow server` on loopback: a 2-rank run's metrics read
back through the MLflow client equal metrics/rank0.jsonl; a relaunch that resumes from the
checkpoint continues the same MLflow run; a server killed mid-run does not stop training,
what it missed is sent by `toolkit track sync` once it is back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.checkpoint.conftest import launch, start  # noqa: F401, F811 - start is a fixture
from tests.cli.conftest import toolkit
from toolkit.events import read_steps

pytestmark = [pytest.mark.slow, pytest.mark.load_tolerant]

MLFLOW_RUN = ["tracking=mlflow", "telemetry=off", "tracking.experiment=tests"]


def tracked(run_dir: Path) -> dict:
    return json.loads((run_dir / "tracking" / "trackers.json").read_text())["mlflow"]


def history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_a_run_and_its_resumed_relaunch_are_one_mlflow_run(tmp_path, mlflow_server_factory):
    from mlflow.tracking import MlflowClient

    server = mlflow_server_factory()
    run_dir = tmp_path / "run"
    tracking = [*MLFLOW_RUN, f"tracking.mlflow_tracking_uri={server.uri}"]
    periodic = ["checkpoint=periodic", "checkpoint.interval_steps=2"]
    first = launch(run_dir, *tracking, *periodic, "trainer.steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = tracked(run_dir)["run_id"]
    assert (run_dir / "tracking" / "mlflow_run_id").stat().st_mode & 0o777 == 0o600
    assert tracked(run_dir)["url"].endswith(f"/runs/{run_id}")

    client = MlflowClient(tracking_uri=server.uri)
    steps = read_steps(run_dir / "metrics" / "rank0.jsonl")
    for field in ("loss", "grad_norm", "lr", "step_time_s", "tokens_per_s", "mfu", "data_wait_s"):
        assert history(client, run_id, f"train/{field}") == pytest.approx(
            {s["step"]: s[field] for s in steps}
        ), field
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.steps"] == "4"
    assert "tracking=mlflow" in run.data.params["launch.overrides"]
    assert "val_loss" in json.loads(  # the final eval, as a metric
        (run_dir / "summary.json").read_text()
    ) and history(client, run_id, "eval/val_loss")
    assert history(client, run_id, "event/checkpoint/duration_s")
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"summary.json", "events-rank0.jsonl"} <= artifacts

    again = launch(run_dir, *tracking, *periodic, "trainer.steps=6")
    assert again.returncode == 0, again.stderr[-3000:]
    assert tracked(run_dir)["run_id"] == run_id
    listed = toolkit(tmp_path, "runs", str(run_dir), "--json")
    assert json.loads(listed.stdout)[0]["trackers"]["mlflow"] == tracked(run_dir)["url"]
    experiment = client.get_experiment_by_name("tests")
    assert len(client.search_runs([experiment.experiment_id])) == 1
    assert sorted(history(client, run_id, "train/loss")) == [1, 2, 3, 4, 5, 6]
    assert history(client, run_id, "event/restart/duration_s")


def test_a_server_down_at_the_end_is_caught_up_by_track_sync(
    tmp_path,
    mlflow_server_factory,
    start,  # noqa: F811 - the fixture
):
    """The server dies mid-run and is still down when the run ends: training goes on, what
    MLflow missed waits in the run dir, the MLflow run stays RUNNING. Once the server is
    back, `toolkit track sync RUN` sends the rest and ends the run; the same command fills a
    TensorBoard log dir the run never had, read back with TensorBoard's own reader."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    server = mlflow_server_factory()
    port = int(server.uri.rsplit(":", 1)[1])
    run_dir = tmp_path / "run"
    job = start(
        run_dir,
        *MLFLOW_RUN,
        f"tracking.mlflow_tracking_uri={server.uri}",
        "trainer.steps=30",
        "fault.data_delay_s=0.2",  # a slow run: the server dies while it trains
        "tracking.close_timeout_s=5",
        "tracking.retry_interval_s=1",
    )
    client = MlflowClient(tracking_uri=server.uri)
    run_id_file = run_dir / "tracking" / "mlflow_run_id"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        run_id_file.is_file() and history(client, run_id_file.read_text(), "train/loss")
    ):
        time.sleep(0.2)
    run_id = run_id_file.read_text()
    server.kill()
    out, _ = job.communicate(timeout=180)  # stderr comes with stdout
    assert job.returncode == 0, out[-3000:]
    steps = read_steps(run_dir / "metrics" / "rank0.jsonl")
    assert len(steps) == 30  # every step trained
    record = tracked(run_dir)
    assert record["dropped"] == 0 and record["spooled"] > 0 and record["unfinished"]
    assert "logging failed" in record["error"]
    listed = json.loads(toolkit(tmp_path, "runs", str(run_dir), "--json").stdout)[0]
    assert "its run not ended: toolkit track sync" in listed["trackers"]["mlflow"]
    spool = run_dir / "tracking" / "spool-mlflow.jsonl"
    assert spool.stat().st_mode & 0o777 == 0o600
    stderr = (run_dir / "logs" / "rank0.err").read_text()
    assert sum("spool-mlflow.jsonl" in line for line in stderr.splitlines()) == 1
    # Each kind of failure once: as many warning lines as kinds recorded.
    said = [line for line in stderr.splitlines() if "tracking: mlflow: " in line]
    assert len(said) == len(record["errors"]), said

    server = mlflow_server_factory(port=port)  # back, with its store
    client = MlflowClient(tracking_uri=server.uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    synced = toolkit(tmp_path, "track", "sync", str(run_dir), "--tracker", "mlflow")
    assert synced.returncode == 0, synced.stderr
    assert "its run ended" in synced.stdout
    assert history(client, run_id, "train/loss") == pytest.approx(
        {s["step"]: s["loss"] for s in steps}
    )
    assert client.get_run(run_id).info.status == "FINISHED"
    assert not spool.exists() and not tracked(run_dir)["unfinished"]
    again = toolkit(tmp_path, "track", "sync", str(run_dir), "--tracker", "mlflow")
    assert "sent 0 step record(s)" in again.stdout  # nothing twice

    synced = toolkit(tmp_path, "track", "sync", str(run_dir), "--tracker", "tensorboard")
    assert synced.returncode == 0, synced.stderr
    tb = EventAccumulator(str(run_dir / "tracking" / "tensorboard"))
    tb.Reload()
    loss = {e.step: e.value for e in tb.Scalars("train/loss")}
    assert loss == pytest.approx({s["step"]: s["loss"] for s in steps})
