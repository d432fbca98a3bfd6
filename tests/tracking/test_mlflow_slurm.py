"""A preempted and requeued job on the dev Slurm cluster is one MLflow run: the requeued
attempt finds the run id in the run dir and continues it."""

from __future__ import annotations

import json

import pytest

from tests.executors.slurm_jobs import STEPS, events, wait_for
from tests.executors.test_preemption import job_state, submit_and_signal_while_held

pytestmark = pytest.mark.slurm


def test_a_requeued_job_continues_its_mlflow_run(slurm_cluster, tmp_path, mlflow_server_factory):
    from mlflow.tracking import MlflowClient

    server = mlflow_server_factory()
    run_dir = tmp_path / "preempted"
    job_id = submit_and_signal_while_held(
        slurm_cluster,
        run_dir,
        "tracking=mlflow",
        f"tracking.mlflow_tracking_uri={server.uri}",
        "tracking.experiment=requeue",
    )
    slurm_cluster.release_requeued(job_id)
    wait_for(lambda: events(run_dir, "restart"), 240, "the requeued job to resume")
    wait_for(lambda: job_state(slurm_cluster, job_id) == "COMPLETED", 300, "job completion")

    record = json.loads((run_dir / "tracking" / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name("requeue")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == record["run_id"]
    assert run.info.status == "FINISHED"
    steps = {m.step for m in client.get_metric_history(run.info.run_id, "train/loss")}
    assert steps == set(range(1, STEPS + 1))  # both attempts' steps, in one run
    assert client.get_metric_history(run.info.run_id, "event/preemption/duration_s")
    assert client.get_metric_history(run.info.run_id, "event/restart/duration_s")
