"""The tracking group: off by default, one tracker or several as a list of options, and
the values that are refused before any rank starts."""

from __future__ import annotations

import pytest

from tests.conftest import launch
from toolkit.config.compose import compose_raw, to_job


@pytest.mark.parametrize(
    ("overrides", "backends"),
    [
        ([], []),
        (["tracking=mlflow"], ["mlflow"]),
        (["tracking=[tensorboard,mlflow]"], ["tensorboard", "mlflow"]),
        (["tracking=[tensorboard,mlflow,wandb]"], ["tensorboard", "mlflow", "wandb"]),
        (["tracking=tensorboard", "tracking.wandb=true"], ["tensorboard", "wandb"]),
    ],
)
def test_trackers_are_chosen_by_options_that_add_up(overrides, backends):
    assert to_job(compose_raw(overrides)).tracking.backends == backends


def test_a_password_in_the_tracking_uri_stops_the_launch_in_one_line():
    done = launch(
        "tracking=mlflow",
        "tracking.mlflow_tracking_uri=https://me:hunter2@mlflow.corp",
        "--cfg",
        "job",
    )
    assert done.returncode == 2
    (line,) = [x for x in done.stderr.splitlines() if "mlflow_tracking_uri" in x]
    assert "MLFLOW_TRACKING_PASSWORD" in line and "hunter2" not in done.stderr + done.stdout
