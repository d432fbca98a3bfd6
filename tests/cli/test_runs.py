"""`toolkit runs` and `toolkit status` over real run directories: a completed run (from an
own config dir), a failed one (fault.fail_at_step) and a preempted one (SIGUSR2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.checkpoint.conftest import launch, start, wait_for  # noqa: F401 - start is a fixture
from tests.checkpoint.test_resume import rank_process
from tests.cli.conftest import toolkit
from toolkit.errors import EXIT_PREEMPTED

pytestmark = [pytest.mark.slow, pytest.mark.load_tolerant]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    own = root.parent / "own-conf"
    (own / "model").mkdir(parents=True)
    (own / "model" / "mini.yaml").write_text(
        "# A mini model.\ndefaults:\n  - model_schema\nname: mini\ndim: 32\nnum_heads: 2\nnum_layers: 1\n"
    )
    ok = launch(
        root / "ok",
        "--config-dir",
        str(own),
        "model=mini",
        "checkpoint.enabled=true",
        "telemetry=off",
    )
    assert ok.returncode == 0, ok.stderr
    failed = launch(root / "failed", "fault.fail_at_step=2", "telemetry=off")
    assert failed.returncode != 0
    return root


@pytest.fixture(scope="module")
def preempted(runs_root) -> Path:
    run_dir = runs_root / "preempted"
    from tests.checkpoint.conftest import cli, env

    job = subprocess.Popen(
        cli(run_dir, "checkpoint.enabled=true", "trainer.steps=400", "telemetry=off"),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log0 = run_dir / "logs" / "rank0.log"
    wait_for(lambda: log0.exists() and "preemption signals armed" in log0.read_text(), what="start")
    import signal

    rank_process(job.pid, 1).send_signal(signal.SIGUSR2)
    out, _ = job.communicate(timeout=180)
    assert job.returncode == EXIT_PREEMPTED, out
    return run_dir


def test_runs_lists_completed_failed_and_preempted(runs_root, preempted, tmp_path):
    done = toolkit(tmp_path, "runs", str(runs_root), "--json")
    assert done.returncode == 0, done.stderr
    by_name = {Path(r["run_dir"]).name: r for r in json.loads(done.stdout)}
    assert {n: r["state"] for n, r in by_name.items()} == {
        "ok": "completed",
        "failed": "failed",
        "preempted": "preempted",
    }
    ok = by_name["ok"]
    assert ok["steps"] == ok["total_steps"] == 8 and ok["loss"] > 0 and ok["tokens_per_s"] > 0
    assert "model=mini" in ok["overrides"] and not any(
        o.startswith("hydra.") for o in ok["overrides"]
    )
    assert "data=text" not in ok["overrides"]  # what the defaults choose anyway
    assert "fault.fail_at_step=2" in by_name["failed"]["overrides"]
    assert by_name["preempted"]["last_checkpoint"].endswith(
        f"step-{by_name['preempted']['steps']:08d}"
    )
    table = toolkit(tmp_path, "runs", str(runs_root)).stdout
    assert table.splitlines()[0].split()[:5] == ["state", "steps", "loss", "throughput", "MFU"]
    assert " tokens/s " in table.splitlines()[1]  # gpt_tiny: a token model
    assert len(table.splitlines()) == 4


def test_status_of_a_run_dir(runs_root, tmp_path):
    done = toolkit(tmp_path, "status", str(runs_root / "ok"))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "state       completed" in text and "step        8 / 8" in text
    assert "checkpoint  " + str(runs_root / "ok" / "checkpoints" / "step-00000008") in text
    assert (
        "attempts    1" in text and "summary     " + str(runs_root / "ok" / "summary.json") in text
    )
    assert toolkit(tmp_path, "status", str(runs_root)).returncode == 2


def test_launch_yaml_records_the_file_of_every_option(runs_root):
    record = OmegaConf.load(runs_root / "ok" / "launch.yaml")
    assert record.sources.model.endswith("own-conf/model/mini.yaml (command-line)")
    assert record.sources.data.endswith("conf/data/text.yaml (package)")


def test_export_and_report_subcommands_on_a_real_run(runs_root, tmp_path):
    out = tmp_path / "model.safetensors"
    done = toolkit(tmp_path, "export", str(runs_root / "ok"), str(out))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0
    # telemetry=off: the report says so in one line and fails
    report = toolkit(tmp_path, "report", str(runs_root / "ok"))
    assert report.returncode != 0 and len(report.stderr.strip().splitlines()) <= 2


def test_report_and_watch_subcommands_read_a_run_with_telemetry(tmp_path):
    run_dir = tmp_path / "telemetry"
    done = launch(run_dir, "trainer.steps=4")  # telemetry is on by default
    assert done.returncode == 0, done.stderr
    report = toolkit(tmp_path, "report", str(run_dir), "--no-sacct")
    assert report.returncode == 0, report.stderr
    assert (run_dir / "telemetry" / "report" / "report.html").is_file()
    watch = toolkit(tmp_path, "watch", str(run_dir), "--once")
    assert watch.returncode == 0, watch.stderr
    assert "step" in watch.stdout
