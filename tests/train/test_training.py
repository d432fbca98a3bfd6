"""End-to-end: the real launcher starts 2 ranks (gloo on CPU) that train with FSDP2."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import launch, losses


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_default_command_trains_and_fills_the_run_dir(tmp_path) -> None:
    run = tmp_path / "run"
    result = launch(
        "trainer.steps=40",
        "trainer.progress=false",
        f"hydra.run.dir={run}",
        env={"MY_API_KEY": "s3cret"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    curve = losses(run)
    assert len(curve) == 40
    assert sum(curve[-5:]) / 5 < 0.8 * sum(curve[:5]) / 5, "the loss must clearly fall"
    # the run directory holds the resolved config, an environment snapshot and per-step metrics
    assert "gpt_small" in (run / "config.yaml").read_text()
    env = json.loads((run / "env.json").read_text())
    assert env["git"]["sha"] and env["git"]["dirty"] in (True, False)
    assert env["torch"] and "python" in env and env["host"]
    assert any(p.startswith("torch==") for p in env["packages"])
    assert env["environment"]["MY_API_KEY"] == "<redacted>"
    record = json.loads((run / "metrics" / "rank1.jsonl").read_text().splitlines()[-1])
    for key in (
        "loss",
        "grad_norm",
        "lr",
        "step_time_s",
        "data_wait_s",
        "tokens_per_s",
        "mfu",
        "mem_peak_bytes",
    ):
        assert key in record
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["steps"] == 40 and summary["median_tokens_per_s"] > 0 and summary["median_mfu"] > 0
    )
    assert "run summary" in result.stdout and str(run) in result.stdout


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_fsdp_shards_parameters_across_ranks(tmp_path, tiny) -> None:
    result = launch(*tiny, "cluster.tasks_per_node=2", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    shards = [
        json.loads((tmp_path / "metrics" / f"rank{r}-model.json").read_text()) for r in (0, 1)
    ]
    total = shards[0]["param_bytes_total"]
    for shard in shards:
        assert shard["param_bytes_local"] == pytest.approx(total / 2, rel=0.05)


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_same_seed_gives_bitwise_identical_losses(tmp_path, tiny) -> None:
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        result = launch(*tiny, "seed=3", f"hydra.run.dir={run}")
        assert result.returncode == 0, result.stderr[-3000:]
    assert losses(runs[0]) == losses(runs[1])
    other = tmp_path / "c"
    assert launch(*tiny, "seed=4", f"hydra.run.dir={other}").returncode == 0
    assert losses(other) != losses(runs[0])


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_gradient_accumulation_matches_a_larger_micro_batch(tmp_path, tiny) -> None:
    accumulated, single = tmp_path / "accum", tmp_path / "single"
    r1 = launch(
        *tiny, "trainer.micro_batch_size=2", "trainer.grad_accum=2", f"hydra.run.dir={accumulated}"
    )
    r2 = launch(
        *tiny, "trainer.micro_batch_size=4", "trainer.grad_accum=1", f"hydra.run.dir={single}"
    )
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr[-2000:] + r2.stderr[-2000:]
    assert losses(accumulated) == pytest.approx(losses(single), rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_a_failing_rank_fails_the_job_fast_with_its_error(tmp_path, tiny) -> None:
    started = time.time()
    result = launch(
        *tiny,
        "trainer.steps=200",
        "fault.fail_at_step=3",
        "fault.fail_rank=1",
        f"hydra.run.dir={tmp_path}",
    )
    elapsed = time.time() - started
    assert result.returncode != 0
    assert "rank 1 failed" in result.stderr
    assert "injected failure at step 3" in result.stderr
    assert elapsed < 60, "the other rank must not hang in a collective"


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_time_series_transformer_learns_returns(tmp_path) -> None:
    result = launch(
        "experiment=returns",
        "trainer.steps=30",
        "trainer.progress=false",
        "model.num_layers=2",
        "model.dim=64",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    curve = losses(tmp_path)
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_bf16_and_activation_checkpointing_train(tmp_path, tiny) -> None:
    result = launch(
        *tiny,
        "precision=bf16",
        "parallel.activation_checkpointing=true",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    curve = losses(tmp_path)
    assert len(curve) == 8 and curve[-1] < curve[0]


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_hsdp_mesh_trains_on_four_ranks(tmp_path, tiny) -> None:
    result = launch(*tiny, "parallel=hsdp", "cluster.tasks_per_node=4", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    shard = json.loads((tmp_path / "metrics" / "rank0-model.json").read_text())
    assert shard["param_bytes_local"] == pytest.approx(shard["param_bytes_total"] / 2, rel=0.05)


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_compiled_blocks_train(tmp_path, tiny) -> None:
    result = launch(*tiny, "parallel.compile=true", f"hydra.run.dir={tmp_path}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(losses(tmp_path)) == 8


@pytest.mark.slow
def test_detached_launch_returns_at_once_and_the_run_completes(tmp_path, tiny) -> None:
    started = time.time()
    result = launch(*tiny, "launch.detach=true", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "detached" in result.stdout
    assert time.time() - started < 15
    deadline = time.time() + 120
    while not (tmp_path / "summary.json").exists() and time.time() < deadline:
        time.sleep(0.5)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 8
