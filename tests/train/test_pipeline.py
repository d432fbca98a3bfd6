"""Pipeline parallelism through the real CLI (gloo on CPU, the local executor): seeded
gpt_tiny runs on pipelined layouts agree with one rank, every schedule agrees, and each
layout is bitwise deterministic.

Tolerance: losses within 1e-5 absolute and grad norms within 1e-5 relative of the 1-rank
run over 20 steps. The layouts compute the same float32 math in another order (the grad
norm as per-stage squared norms summed over the pp group, gradients reduce-scattered over
dp ranks, micro-batch losses averaged after the sum rather than each scaled first): a few
ulps (1e-7 relative) per step, which Adam carries forward without amplifying over 20
steps; 1e-5 leaves a wide margin and still catches any real difference (a wrong stage
order, a lost micro-batch or a gradient counted twice moves the loss by 1e-3 or more)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import launch

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

STEPS = 20
BASE = [
    "model=gpt_tiny",
    "data=text",  # world-size independent windows: every layout sees the same batches
    "data.seq_len=32",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=8",
    "trainer.grad_accum=2",
    "trainer.eval_every=10",
    "trainer.eval_batches=2",
    "trainer.progress=false",
    "seed=7",
]
FOUR_LAYERS = ["model.num_layers=4", "trainer.grad_accum=4"]
LAYOUTS = {
    "one": ["cluster.tasks_per_node=1"],
    "pp2": ["cluster.tasks_per_node=2", "parallel.pp=2"],
    "pp2_dp2": ["cluster.tasks_per_node=4", "parallel.pp=2", "parallel.dp_shard=2"],
    "pp2_dp2_again": ["cluster.tasks_per_node=4", "parallel.pp=2", "parallel.dp_shard=2"],
    "pp2_hsdp": [
        "cluster.tasks_per_node=4",
        "parallel.pp=2",
        "parallel.dp_replicate=2",
        "parallel.dp_shard=1",
    ],
    "one_4l": ["cluster.tasks_per_node=1", *FOUR_LAYERS],
    "gpipe_4l": [
        "cluster.tasks_per_node=2",
        "parallel.pp=2",
        "parallel.pp_schedule=gpipe",
        *FOUR_LAYERS,
    ],
    "1f1b_4l": ["cluster.tasks_per_node=2", "parallel.pp=2", *FOUR_LAYERS],
    "interleaved_4l": [
        "cluster.tasks_per_node=2",
        "parallel.pp=2",
        "parallel.pp_schedule=interleaved_1f1b",
        "parallel.pp_virtual_stages=2",
        *FOUR_LAYERS,
    ],
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run of a named layout (each launched once per module): its run dir."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            run_dir = tmp_path_factory.mktemp(name)
            result = launch(*BASE, *LAYOUTS[name], f"hydra.run.dir={run_dir}", timeout=600)
            assert result.returncode == 0, result.stderr[-3000:]
            done[name] = run_dir
        return done[name]

    return get


def records(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics" / "rank0.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def curves(run_dir: Path) -> tuple[list[float], list[float]]:
    recs = records(run_dir)
    return [r["loss"] for r in recs], [r["grad_norm"] for r in recs]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_agree(run_dir: Path, reference: Path) -> None:
    loss, norm = curves(run_dir)
    ref_loss, ref_norm = curves(reference)
    assert len(loss) == STEPS
    assert loss == pytest.approx(ref_loss, abs=1e-5)
    assert norm == pytest.approx(ref_norm, rel=1e-5)
    assert summary(run_dir)["val_loss"] == pytest.approx(summary(reference)["val_loss"], abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["pp2", "pp2_dp2", "pp2_hsdp"])
def test_pipelined_layouts_match_one_rank(run, layout) -> None:
    assert_agree(run(layout), run("one"))
    assert curves(run("one"))[0][-1] < curves(run("one"))[0][0]  # it learns


@pytest.mark.slow
def test_pipeline_with_fsdp_is_bitwise_deterministic_and_records_its_groups(run) -> None:
    assert curves(run("pp2_dp2")) == curves(run("pp2_dp2_again"))
    mesh = json.loads((run("pp2_dp2") / "mesh.json").read_text())
    assert mesh["degrees"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 1}
    assert [g["ranks"] for g in mesh["groups"]["pp"]] == [[0, 2], [1, 3]]
    assert [g["ranks"] for g in mesh["groups"]["dp_shard"]] == [[0, 1], [2, 3]]
    # Each stage's ranks shard only that stage: about half of its parameters each.
    for rank in range(4):
        shard = json.loads((run("pp2_dp2") / "metrics" / f"rank{rank}-model.json").read_text())
        assert shard["param_bytes_local"] == pytest.approx(shard["param_bytes_total"] / 2, rel=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe_4l", "1f1b_4l", "interleaved_4l"])
def test_every_schedule_matches_one_rank(run, schedule) -> None:
    assert_agree(run(schedule), run("one_4l"))


@pytest.mark.slow
def test_pipeline_with_tensor_parallel_matches_one_rank(tmp_path) -> None:
    """{pp=2 tp=2}: each stage split over two tp ranks; the stage boundary carries the
    sequence-sharded hidden states between ranks of the same tp coordinate."""
    result = launch(
        *BASE,
        "cluster.tasks_per_node=4",
        "parallel.pp=2",
        "parallel.tp=2",
        "parallel.dp_shard=1",
        f"hydra.run.dir={tmp_path / 'pp2_tp2'}",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = tmp_path / "one"
    done = launch(*BASE, "cluster.tasks_per_node=1", f"hydra.run.dir={reference}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_agree(tmp_path / "pp2_tp2", reference)


@pytest.mark.slow
def test_time_series_model_pipelines_like_one_rank(tmp_path) -> None:
    common = [
        "experiment=returns",
        "trainer.steps=6",
        "trainer.grad_accum=2",
        "trainer.progress=false",
        "model.num_layers=2",
        "model.dim=32",
    ]
    one, pp2 = tmp_path / "one", tmp_path / "pp2"
    assert launch(*common, "cluster.tasks_per_node=1", f"hydra.run.dir={one}").returncode == 0
    result = launch(*common, "cluster.tasks_per_node=2", "parallel.pp=2", f"hydra.run.dir={pp2}")
    assert result.returncode == 0, result.stderr[-3000:]
    loss, norm = curves(pp2)
    ref_loss, ref_norm = curves(one)
    assert loss == pytest.approx(ref_loss, rel=1e-5) and norm == pytest.approx(ref_norm, rel=1e-5)
    # Evaluation ran on the last stage: the loss and the rank IC of its predictions.
    assert summary(pp2)["val_loss"] == pytest.approx(summary(one)["val_loss"], rel=1e-5)
    assert summary(pp2)["val_ic"] == pytest.approx(summary(one)["val_ic"], abs=1e-5)


@pytest.mark.slow
def test_pipeline_trains_in_bf16_with_activation_checkpointing_and_meta_init(tmp_path) -> None:
    result = launch(
        *BASE,
        "trainer.steps=6",
        "cluster.tasks_per_node=2",
        "parallel.pp=2",
        "precision=bf16",
        "parallel.activation_checkpointing=true",
        "parallel.meta_init=true",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loss, norm = curves(tmp_path)
    assert len(loss) == 6 and loss[-1] < loss[0] and all(n > 0 for n in norm)
    assert 0 < summary(tmp_path)["val_loss"] < loss[0]  # bf16 activations between stages
