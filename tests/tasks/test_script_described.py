"""A script run is described as itself: its trackers get the script (path, arguments with
secrets redacted), not the default model's settings; its step lines hold what it logged and
nothing it did not (no 0.0 for a figure it never measured); the report predicts nothing for
it; a Slurm requeue counts as a restart in `status`. In-process: no rank is started here (the
launches that show the rest are in test_script.py)."""

from __future__ import annotations

import json
import math

from toolkit import session
from toolkit.cli.rundir import script_command_line
from toolkit.config.compose import compose_raw, job_to_dict, to_job
from toolkit.config.script import described
from toolkit.config.tracking import TrackingConfig
from toolkit.events import step_from_line
from toolkit.redact import REDACTED
from toolkit.session import SessionSpec
from toolkit.tasks.script import note_restart, write_summary
from toolkit.telemetry.report.model import predicted_terms
from toolkit.tracking.base import scalars
from toolkit.tracking.build import run_params


def script_job(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    overrides = [f"script.path={tmp_path / 'train.py'}", "script.args=[--lr,'3e-4',--api-key,s3]"]
    return to_job(compose_raw(overrides))


def test_trackers_get_the_script_and_its_redacted_arguments_not_the_default_model(tmp_path):
    params = run_params(
        TrackingConfig(), tmp_path, described(job_to_dict(script_job(tmp_path))), "tokens"
    ).config
    assert params["task"] == "script"
    assert params["script.path"] == str(tmp_path / "train.py")
    assert params["script.args"] in (
        ["--lr", "3e-4", "--api-key", REDACTED],
        str(["--lr", "3e-4", "--api-key", REDACTED]),
    )
    assert "s3" not in json.dumps(params)
    # The built-in task's defaults, which the script never read, are not its parameters.
    assert not [k for k in params if k.split(".")[0] in ("model", "trainer", "data", "optim")]
    assert "cluster.tasks_per_node" in params  # what does apply to a script is kept


def test_status_shows_the_scripts_command_line_with_secrets_redacted():
    script = {"path": "train.py", "args": ["--lr", "3e-4", "--api-key", "s3"], "module": None}
    assert script_command_line(script) == f"python train.py --lr 3e-4 --api-key {REDACTED}"


def test_the_report_predicts_nothing_for_a_script(tmp_path):
    predicted, note = predicted_terms(script_job(tmp_path), 2)
    assert predicted == {}
    assert note.startswith(f"a script run (python {tmp_path / 'train.py'} --lr 3e-4 --api-key ")
    assert note.endswith("): no model prediction (it recorded no model.json)") and "s3" not in note


def test_a_step_line_holds_only_what_the_script_logged(tmp_path, monkeypatch):
    spec = SessionSpec(
        run_dir=str(tmp_path),
        rank=1,  # rank 1: no trackers to start
        attempt=0,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        beat_path=str(tmp_path / "beat"),
        socket=None,
        stop_signals=[],
    )
    monkeypatch.setenv(session.ENV, spec.to_env())
    monkeypatch.setattr(session, "_session", None)
    session.log(1, loss=0.5, ic=0.25)
    (line,) = [json.loads(s) for s in (tmp_path / "metrics" / "rank1.jsonl").open()]
    assert line["loss"] == 0.5 and line["ic"] == 0.25 and line["step"] == 1
    assert line["step_time_s"] >= 0  # measured by the session: always there
    for never_logged in ("grad_norm", "lr", "mfu", "data_wait_s", "tokens_per_s", "tokens"):
        assert never_logged not in line
    # Read back (a tracker's catch-up): what is absent stays absent, not 0.0.
    sent = scalars(step_from_line(line))
    assert sent["train/loss"] == 0.5 and sent["train/ic"] == 0.25
    assert "train/grad_norm" not in sent and "train/tokens_per_s" not in sent
    write_summary(tmp_path, 0)  # rank 1's file is not rank 0's: an empty summary
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 0 and "final_loss" not in summary
    assert "median_tokens_per_s" not in summary


def test_a_summary_keeps_a_logged_nan_loss_out_and_the_last_finite_one(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    lines = [{"step": 1, "loss": 2.0, "attempt": 0}, {"step": 2, "loss": None, "attempt": 0}]
    (metrics / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    write_summary(tmp_path, 0)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["final_loss"] == 2.0
    assert not any(isinstance(v, float) and math.isnan(v) for v in summary.values())


def test_a_requeued_attempt_is_a_restart_event(tmp_path):
    note_restart(tmp_path, 1)
    (event,) = [json.loads(s) for s in (tmp_path / "metrics" / "events-rank0.jsonl").open()]
    assert (event["name"], event["attempt"]) == ("restart", 1)
