"""Your own model through every part of the toolkit: a researcher's LSTM (tests/fixtures/
userpkg, outside the toolkit package, named by import path or registered through an entry
point) and a tiny Hugging Face Llama built from its config, each on 2 ranks with FSDP2.

One checkpointed LSTM run is shared by the module: it trains, shards, writes telemetry,
is reported, listed, exported, and resumed on another world size; the others check what
differs (the HF model, the entry point, the refusals, preemption, the hang watchdog)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, losses, run_module

FIXTURES = REPO / "tests" / "fixtures"
LSTM = [
    "model._target_=userpkg.models.LSTMForecaster",
    "model.num_series=48",
    "model.num_targets=16",
    "model.hidden=16",
    "data=returns",
    "data.num_workers=0",
    "data.seq_len=16",
    "data.synthetic_times=2000",
    "trainer.steps=8",
    "trainer.global_batch_size=8",
    "trainer.eval_batches=1",
    "trainer.log_every=4",
    "trainer.progress=false",
]
CKPT = ["checkpoint.enabled=true", "checkpoint.interval_steps=2"]


def user_env(*extra: Path) -> dict[str, str]:
    """The launcher's and every rank's environment: the user's package on PYTHONPATH, as a
    researcher's installed (or checked-out) package would be."""
    paths = [str(REPO), str(FIXTURES), *map(str, extra), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def launch(run_dir: Path, *overrides: str, extra: tuple[Path, ...] = (), timeout: float = 240):
    return run_module(
        "toolkit.launch",
        *overrides,
        f"hydra.run.dir={run_dir}",
        env=user_env(*extra),
        timeout=timeout,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("lstm")
    done = launch(run_dir, *LSTM, *CKPT)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_a_user_lstm_by_import_path_trains_sharded_in_samples_per_second(lstm_run):
    steps = read_jsonl(lstm_run / "metrics" / "rank0.jsonl")
    assert len(steps) == 8
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert all(s["samples_per_s"] > 0 for s in steps)
    assert all(s["mfu"] > 0 for s in steps[1:])  # from its FLOPs, counted on the first batch
    summary = json.loads((lstm_run / "summary.json").read_text())
    assert summary["throughput_unit"] == "samples"
    assert summary["median_samples_per_s"] > 0
    # FSDP2 sharded it (units: the LSTM's layers, found as its list of like modules).
    shard = json.loads((lstm_run / "metrics" / "rank0-model.json").read_text())
    assert shard["param_bytes_local"] < 0.6 * shard["param_bytes_total"]
    # config.yaml keeps the node flat, as written: it composes again on every rank.
    config = (lstm_run / "config.yaml").read_text()
    assert "_target_: userpkg.models.LSTMForecaster" in config and "hidden: 16" in config


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_the_user_model_run_has_telemetry_a_report_a_listing_and_an_export(lstm_run, tmp_path):
    node_files = list((lstm_run / "telemetry").glob("*.h5"))
    assert node_files, "no node telemetry file"
    env = user_env()
    report = run_module("toolkit.telemetry", "report", str(lstm_run), env=env, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "Where the time went" in report.stdout
    assert "performance model unavailable" not in report.stdout
    import csv

    with open(lstm_run / "telemetry" / "report" / "steps.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["rank"] == "0"]
    assert [float(r["loss"]) for r in rows] == pytest.approx(losses(lstm_run), rel=1e-5)
    status = run_module("toolkit.cli", "status", str(lstm_run), env=env, timeout=60)
    assert status.returncode == 0, status.stderr[-2000:]
    assert "completed" in status.stdout
    runs = run_module("toolkit.cli", "runs", str(lstm_run.parent), env=env, timeout=60)
    assert runs.returncode == 0 and lstm_run.name in runs.stdout, runs.stderr[-2000:]
    out = tmp_path / "lstm.safetensors"
    export = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "export_model.py"), str(lstm_run), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert export.returncode == 0, export.stderr[-2000:]
    from safetensors.torch import load_file

    sys.path.insert(0, str(FIXTURES))
    from userpkg.models import LSTMForecaster

    tensors = load_file(out)
    model = LSTMForecaster(48, 16, hidden=16)
    assert set(tensors) == set(model.state_dict())
    model.load_state_dict(tensors)  # the user's own class loads the consolidated weights


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_two_rank_user_checkpoint_resumes_on_one_rank(lstm_run, tmp_path):
    reference = losses(lstm_run)
    source = lstm_run / "checkpoints" / "step-00000004"
    if not source.exists():  # retention may keep other steps: take the oldest kept
        source = sorted((lstm_run / "checkpoints").glob("step-*"))[0]
    resumed_at = int(source.name.split("-")[1])
    run_dir = tmp_path / "one"
    done = launch(
        run_dir, *LSTM, *CKPT, f"checkpoint.resume_from={source}", "cluster.tasks_per_node=1"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics" / "rank0.jsonl")}
    assert sorted(resumed) == list(range(resumed_at + 1, 9))
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step - 1], abs=1e-4)  # reduction order differs


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_preempted_user_model_checkpoints_and_resumes_bitwise(lstm_run, tmp_path):
    from tests.checkpoint.test_resume import rank_process
    from toolkit.errors import EXIT_PREEMPTED

    run_dir = tmp_path / "preempted"
    slow = ["checkpoint.enabled=true", "fault.data_delay_s=0.3"]  # time to be signalled
    job = subprocess.Popen(
        [sys.executable, "-m", "toolkit.launch", *LSTM, *slow, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        metrics = run_dir / "metrics" / "rank0.jsonl"
        _wait(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2)
        rank_process(job.pid, 1).send_signal(signal.SIGUSR2)  # one rank: all must agree
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == EXIT_PREEMPTED, out[-3000:]
    events = read_jsonl(run_dir / "metrics" / "events-rank0.jsonl")
    stopped_at = next(e["step"] for e in events if e["name"] == "preemption")
    assert 1 <= stopped_at < 8
    assert (run_dir / "checkpoints" / f"step-{stopped_at:08d}").is_dir()
    done = launch(run_dir, *LSTM, "checkpoint.enabled=true")
    assert done.returncode == 0, done.stderr[-3000:]
    after = {r["step"]: r["loss"] for r in read_jsonl(metrics)}
    assert [after[s] for s in range(1, 9)] == losses(lstm_run)  # bitwise, every step


@pytest.mark.slow
@pytest.mark.waits
def test_a_hung_rank_of_a_user_model_is_caught_by_the_watchdog(tmp_path):
    from toolkit.errors import EXIT_HANG

    done = launch(
        tmp_path,
        *LSTM,
        "trainer.steps=400",
        "fault.hang_at_step=3",
        "fault.hang_rank=1",
        "fault.hang_timeout_s=5",
        "fault.hang_startup_timeout_s=60",
        timeout=180,
    )
    assert done.returncode == EXIT_HANG, done.stderr[-3000:]
    assert "hang: rank 1" in done.stderr
    assert any((tmp_path / "hangs").iterdir())


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_user_model_trains_on_a_user_dataset_from_the_command_line_alone(tmp_path):
    model = [o for o in LSTM if o.startswith("model.")]
    done = launch(
        tmp_path,
        *model,
        "data._target_=userpkg.datasets.NoisySeries",
        "data.length=512",
        "data.window=16",
        "data.num_series=48",
        "data.num_targets=16",
        "data.seq_len=16",
        "data.num_workers=0",
        "data.val_fraction=0.1",
        "trainer.steps=6",
        "trainer.global_batch_size=8",
        "trainer.progress=false",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_jsonl(tmp_path / "metrics" / "rank0.jsonl")
    assert len(steps) == 6 and all(s["samples_per_s"] > 0 for s in steps)
    assert all(s["mfu"] > 0 for s in steps[1:])  # from its FLOPs, counted on the first batch
    assert json.loads((tmp_path / "summary.json").read_text())["val_loss"] is not None
    # What the run's readers take instead of building the model: RUN/model.json.
    recorded = json.loads((tmp_path / "model.json").read_text())
    assert recorded["unit"] == "samples" and recorded["tokens_per_sample"] == 0
    assert recorded["flops_per_sample"] > 0 and recorded["num_params"] > 0
    assert recorded["input_shape"] == [16, 48]  # one window: 16 steps x 48 series


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_tiny_hf_llama_trains_sharded_by_decoder_layer(tmp_path):
    done = launch(
        tmp_path,
        "model=hf_llama_tiny",
        "data.seq_len=32",
        "trainer.steps=6",
        "trainer.progress=false",
        "parallel.meta_init=true",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_jsonl(tmp_path / "metrics" / "rank0.jsonl")
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert all(s["tokens_per_s"] > 0 for s in steps)
    assert all(s["mfu"] > 0 for s in steps[1:])
    shard = json.loads((tmp_path / "metrics" / "rank0-model.json").read_text())
    assert shard["param_bytes_local"] == pytest.approx(shard["param_bytes_total"] / 2, rel=0.05)


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_tiny_hf_llama_checkpoint_resumes_bitwise(tmp_path):
    hf = ["model=hf_llama_tiny", "data.seq_len=32", "trainer.progress=false"]
    whole = launch(tmp_path / "whole", *hf, "trainer.steps=6")
    assert whole.returncode == 0, whole.stderr[-3000:]
    run_dir = tmp_path / "resumed"
    first = launch(run_dir, *hf, "trainer.steps=6", *CKPT, "fault.fail_at_step=4")
    assert first.returncode != 0  # a rank crashes before step 5
    assert list((run_dir / "checkpoints").glob("step-*"))  # step 2's at least committed
    again = launch(run_dir, *hf, "trainer.steps=6", *CKPT)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics" / "rank0.jsonl")}
    assert [resumed[s] for s in range(1, 7)] == losses(tmp_path / "whole")  # bitwise


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_model_registered_by_entry_point_is_found_and_its_options_checked(tmp_path):
    dist = FIXTURES / "userpkg_dist"  # userpkg's installed metadata: its entry points
    series = [o for o in LSTM if not o.startswith("model.")]
    done = launch(
        tmp_path / "ok",
        "model.kind=lstm_forecaster",
        "+model.hidden=8",
        *series,
        "trainer.steps=3",
        extra=(dist,),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(read_jsonl(tmp_path / "ok" / "metrics" / "rank0.jsonl")) == 3
    bad = launch(
        tmp_path / "bad", "model.kind=lstm_forecaster", "+model.hiden=8", *series, extra=(dist,)
    )
    assert bad.returncode == 2
    (line,) = [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]
    assert "model.hiden" in line and "num_series, num_targets, hidden, num_layers" in line
    unknown = launch(tmp_path / "unknown", "model.kind=lstm_forecastr", *series, extra=(dist,))
    assert unknown.returncode == 2
    assert "model.kind=lstm_forecastr: unknown; known kinds: gpt, timeseries" in unknown.stderr


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        (["parallel.tp=2"], "parallel.tp=2: model LSTMForecaster has no tensor-parallel plan"),
        (
            ["parallel.pp=2", "trainer.grad_accum=2", "trainer.global_batch_size=null"],
            "parallel.pp=2: model LSTMForecaster has no pipeline split",
        ),
    ],
)
def test_a_layout_the_user_model_cannot_run_is_refused_in_one_line(tmp_path, layout, says):
    done = launch(tmp_path, *LSTM, *layout, "launch.dry_run=true", timeout=60)
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert any(says in ln for ln in errors), done.stderr[-2000:]


def test_a_missing_user_module_is_one_line_before_any_rank(tmp_path):
    done = launch(tmp_path, *LSTM, "model._target_=userpkg.nosuch.Model", timeout=60)
    assert done.returncode == 2
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert "model._target_=userpkg.nosuch.Model" in line
    assert not (tmp_path / "logs").exists()


def _wait(predicate, timeout_s: float = 120) -> None:
    import time

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError("condition not met")
