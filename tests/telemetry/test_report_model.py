"""The report's one call into the performance model keeps working as the model changes."""

from __future__ import annotations

from toolkit.config.compose import compose_raw, to_job
from toolkit.telemetry.report.model import MEASURED_OF_TERM, predicted_terms


def test_every_compared_term_is_predicted_for_a_real_job():
    job = to_job(compose_raw(["model=gpt_tiny", "cluster.tasks_per_node=2"]))
    predicted, note = predicted_terms(job, 2)
    assert note == ""
    # Every measured term, and the model's own arithmetic (the too-small check's, not compared).
    assert set(predicted) == {*MEASURED_OF_TERM, "arithmetic"}
    assert 0 < predicted["arithmetic"] < predicted["compute"]
    assert predicted["step"] > 0 and predicted["compute"] > 0
    assert predicted["exposed_communication"] <= predicted["communication"]


def test_without_a_config_the_report_says_why():
    assert predicted_terms(None, 2) == ({}, "no readable RUN_DIR/config.yaml: no model prediction")
