"""tracking=[tensorboard,wandb]: one 2-rank run; TensorBoard's own EventAccumulator reads
back the scalars of metrics/rank0.jsonl, and W&B's offline run file (no network) holds the
same history. Rank 1 writes to no tracker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.checkpoint.conftest import cli, env
from tests.tracking.conftest import wandb_history
from toolkit.events import read_steps

pytestmark = [pytest.mark.slow, pytest.mark.load_tolerant]

SECRET = "wandb-key-that-must-not-be-written-9f3c"
FIELDS = ("loss", "grad_norm", "lr", "step_time_s", "tokens_per_s", "mfu", "data_wait_s")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    command = cli(
        run_dir,
        "tracking=[tensorboard,wandb]",  # telemetry on: `toolkit compare` reads it
        "trainer.steps=6",
        "trainer.eval_every=3",
        "checkpoint=periodic",
        "checkpoint.interval_steps=3",
    )
    secrets = {"WANDB_API_KEY": SECRET, "MLFLOW_TRACKING_PASSWORD": SECRET}
    done = subprocess.run(command, env=env() | secrets, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_tensorboard_scalars_equal_the_jsonl(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = json.loads((run_dir / "tracking" / "trackers.json").read_text())["tensorboard"]
    events = EventAccumulator(logdir["logdir"]).Reload()
    steps = read_steps(run_dir / "metrics" / "rank0.jsonl")
    for field in FIELDS:
        scalars = {e.step: e.value for e in events.Scalars(f"train/{field}")}
        assert scalars == pytest.approx({s["step"]: s[field] for s in steps}, rel=1e-6), field
    evals = read_steps(run_dir / "metrics" / "events-rank0.jsonl")
    val_losses = {e["step"]: e["attrs"]["val_loss"] for e in evals if e["name"] == "eval"}
    assert len(val_losses) == 2  # step 3 and the final eval
    assert {e.step: e.value for e in events.Scalars("eval/val_loss")} == pytest.approx(val_losses)
    assert [e.step for e in events.Scalars("event/checkpoint/duration_s")] == [3, 6]
    assert "config/text_summary" in events.Tags()["tensors"]


def test_wandb_offline_run_holds_the_history(run_dir):
    record = json.loads((run_dir / "tracking" / "trackers.json").read_text())["wandb"]
    assert record["mode"] == "offline" and record["dropped"] == 0
    offline = Path(record["dir"])
    assert offline.parent == run_dir / "tracking" / "wandb"
    (run_file,) = offline.glob("run-*.wandb")
    history = wandb_history(run_file)
    losses = {row["_step"]: row["train/loss"] for row in history if "train/loss" in row}
    steps = read_steps(run_dir / "metrics" / "rank0.jsonl")
    assert losses == pytest.approx({s["step"]: s["loss"] for s in steps})
    assert any("eval/val_loss" in row for row in history)
    assert (offline / "files" / "summary.json").is_file()  # uploaded at `wandb sync`


def test_only_rank0_tracks_and_no_secret_reaches_a_tracker_file(run_dir):
    assert len(list((run_dir / "tracking" / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert "tracking" not in (run_dir / "logs" / "rank1.err").read_text().lower()
    written = [p for p in (run_dir / "tracking").rglob("*") if p.is_file()]
    assert written
    assert [p for p in written if SECRET.encode() in p.read_bytes()] == []


def test_runs_and_compare_point_at_the_trackers(run_dir, tmp_path):
    from tests.cli.conftest import toolkit
    from toolkit.telemetry.compare import compare

    listed = toolkit(tmp_path, "runs", str(run_dir), "--json")
    assert listed.returncode == 0, listed.stderr
    (info,) = json.loads(listed.stdout)
    logdir = str(run_dir / "tracking" / "tensorboard")
    assert info["trackers"]["tensorboard"] == logdir
    assert info["trackers"]["wandb"].startswith(
        str(run_dir / "tracking" / "wandb" / "offline-run-")
    )
    assert compare(run_dir, run_dir)["trackers"]["b"]["tensorboard"] == logdir


def test_node_telemetry_series_reach_the_tracker(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from toolkit.telemetry.read import load_node, node_files

    (path,) = node_files(run_dir)
    node = load_node(path, events=False)
    try:
        cpu = [float(v) for v in node.host["cpu_pct"]]
        tag = f"node/{node.node}/cpu_pct"
    finally:
        node.close()
    events = EventAccumulator(str(run_dir / "tracking" / "tensorboard")).Reload()
    assert cpu and [e.value for e in events.Scalars(tag)] == pytest.approx(cpu, rel=1e-6)
    wandb_run = json.loads((run_dir / "tracking" / "trackers.json").read_text())["wandb"]
    (run_file,) = Path(wandb_run["dir"]).glob("run-*.wandb")
    assert [row[tag] for row in wandb_history(run_file) if tag in row] == pytest.approx(cpu)
