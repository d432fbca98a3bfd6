"""Tensor parallelism through the real launcher (gloo on CPU, real process groups): every
layout trains the same model as one rank, each layout is bitwise deterministic, and a
checkpoint written under {dp_shard=2, tp=2} resumes under {dp_shard=4} and on one rank.

Tolerance: relative 1e-5 on losses and grad norms over 10 steps. The layouts compute the
same fp32 function, but sums are split differently (a matmul's reduction over a tp-sharded
dimension is added in another order, FSDP's reduce-scatter and the loss all-reduce sum
ranks in another order), so results differ by a few fp32 roundings (eps 1.2e-7) that Adam
carries forward; measured: at most 5e-7 relative. A real layout bug (a wrong head split, a
missing reduction) shows up as 1e-2 or more from the first step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, launch, run_module
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.validate import validate

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

STEPS = 10
RESUME_AT = 5
RTOL = 1e-5
BASE = [
    "model=gpt_tiny",
    "data.seq_len=64",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=8",  # the same sequences per step on every layout
    "trainer.eval_batches=1",
    "trainer.log_every=10",
    "trainer.progress=false",
    "seed=5",
]
LAYOUTS = {  # name -> overrides
    "one": ["cluster.tasks_per_node=1"],
    "tp2": ["cluster.tasks_per_node=2", "parallel.tp=2"],
    "dp4": ["cluster.tasks_per_node=4"],
    "dp2tp2": ["cluster.tasks_per_node=4", "parallel.tp=2"],
    # HSDP x TP (every parameter a 3-D DTensor) with gradient accumulation
    "hsdp2tp2-accum2": [
        "cluster.tasks_per_node=4",
        "parallel.tp=2",
        "parallel.dp_replicate=2",
        "parallel.dp_shard=1",
        "trainer.grad_accum=2",
    ],
}
CKPT = ["checkpoint.enabled=true", f"checkpoint.interval_steps={RESUME_AT}"]


def launch_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def records(run_dir: Path) -> dict[int, dict]:
    """Rank 0's step records by step."""
    path = run_dir / "metrics" / "rank0.jsonl"
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


class Runs:
    """Each run once per module, started on first use (tests share them)."""

    def __init__(self, root: Path):
        self.root = root
        self.done: dict[str, Path] = {}

    def get(self, name: str, *overrides: str) -> Path:
        if name not in self.done:
            run_dir = self.root / name
            result = launch(*BASE, *overrides, f"hydra.run.dir={run_dir}", timeout=300)
            assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
            self.done[name] = run_dir
        return self.done[name]

    def layout(self, name: str) -> Path:
        extra = CKPT if name in ("dp2tp2", "dp4") else []  # the sources of the resume tests
        return self.get(name, *LAYOUTS[name], *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("tp"))


@pytest.mark.parametrize(
    "layout",
    ["tp2", "dp4", "dp2tp2", "hsdp2tp2-accum2"],
)
@pytest.mark.slow
def test_a_layout_trains_the_same_model_as_one_rank(runs, layout) -> None:
    one, other = records(runs.layout("one")), records(runs.layout(layout))
    assert sorted(other) == sorted(one) == list(range(1, STEPS + 1))
    for step in one:
        assert other[step]["loss"] == pytest.approx(one[step]["loss"], rel=RTOL), step
        assert other[step]["grad_norm"] == pytest.approx(one[step]["grad_norm"], rel=RTOL), step
    assert one[STEPS]["loss"] < one[1]["loss"] - 0.3, "the model must learn"


@pytest.mark.parametrize("layout", ["tp2", "dp2tp2"])
@pytest.mark.slow
def test_a_layout_run_twice_gives_bitwise_the_same_losses(runs, layout) -> None:
    # dp2tp2's first run checkpoints, its second does not: saving does not perturb training.
    again = runs.get(f"{layout}-again", *LAYOUTS[layout])
    first, second = records(runs.layout(layout)), records(again)
    assert [r["loss"] for r in first.values()] == [r["loss"] for r in second.values()]
    assert [r["grad_norm"] for r in first.values()] == [r["grad_norm"] for r in second.values()]


@pytest.mark.slow
def test_the_run_records_its_layout_and_shards_over_both_dims(runs) -> None:
    run_dir = runs.layout("dp2tp2")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["layout"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    mesh = json.loads((run_dir / "mesh.json").read_text())
    assert [g["ranks"] for g in mesh["groups"]["tp"]] == [[0, 1], [2, 3]]
    assert mesh["warnings"] == []
    report = run_module("toolkit.telemetry", "report", str(run_dir), env=launch_env(), timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "Layout: dp_shard=2 x tp=2" in report.stdout
    report_json = json.loads((run_dir / "telemetry" / "report" / "summary.json").read_text())
    assert report_json["layout"]["degrees"] == summary["layout"]
    shard = json.loads((run_dir / "metrics" / "rank3-model.json").read_text())
    # every parameter is split over the 4 ranks (2D), except LayerNorm weights (dp only)
    assert shard["param_bytes_local"] < 0.3 * shard["param_bytes_total"]


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("dp4", ["cluster.tasks_per_node=4"]), ("one", ["cluster.tasks_per_node=1"])],
    ids=["to-dp_shard4", "to-one-rank"],
)
@pytest.mark.slow
def test_a_2d_checkpoint_resumes_under_another_layout(runs, name, overrides) -> None:
    source = runs.layout("dp2tp2") / "checkpoints" / f"step-{RESUME_AT:08d}"
    resumed = records(
        runs.get(
            f"resume-{name}",
            *overrides,
            "checkpoint.enabled=true",
            f"checkpoint.resume_from={source}",
        )
    )
    reference = records(runs.layout("dp2tp2"))
    assert sorted(resumed) == list(range(RESUME_AT + 1, STEPS + 1))  # the data position
    for step, record in resumed.items():  # model and optimizer state both carried over
        assert record["loss"] == pytest.approx(reference[step]["loss"], rel=RTOL), step
        assert record["grad_norm"] == pytest.approx(reference[step]["grad_norm"], rel=RTOL)
    events = (runs.done[f"resume-{name}"] / "metrics" / "events-rank0.jsonl").read_text()
    restart = next(e for e in map(json.loads, events.splitlines()) if e["name"] == "restart")
    assert "parallel.tp: 2 -> 1" in restart["attrs"]["config_changed"]  # allowed, recorded


@pytest.mark.slow
def test_a_checkpoint_without_tp_resumes_under_tp(runs) -> None:
    source = runs.layout("dp4") / "checkpoints" / f"step-{RESUME_AT:08d}"
    resumed = records(
        runs.get(
            "dp4-to-tp2",
            *LAYOUTS["tp2"],
            "checkpoint.enabled=true",
            f"checkpoint.resume_from={source}",
        )
    )
    reference = records(runs.layout("dp4"))
    assert sorted(resumed) == list(range(RESUME_AT + 1, STEPS + 1))
    for step, record in resumed.items():
        assert record["loss"] == pytest.approx(reference[step]["loss"], rel=RTOL), step


@pytest.mark.slow
def test_bf16_and_activation_checkpointing_train_under_tp(runs) -> None:
    bf16 = records(
        runs.get(
            "tp2-bf16-ac",
            *LAYOUTS["tp2"],
            "precision=bf16",
            "parallel.activation_checkpointing=true",
        )
    )
    fp32 = records(runs.layout("tp2"))
    assert sorted(bf16) == list(range(1, STEPS + 1))
    for step in (1, STEPS):  # bf16 parameters and activations: the same curve, coarser
        assert bf16[step]["loss"] == pytest.approx(fp32[step]["loss"], rel=2e-2)


@pytest.mark.slow
def test_compiled_blocks_under_tp_train_like_eager(runs) -> None:
    compiled = records(runs.get("tp2-compile", *LAYOUTS["tp2"], "parallel.compile=true"))
    eager = records(runs.layout("tp2"))
    assert sorted(compiled) == sorted(eager)
    for step in eager:  # inductor fuses elementwise ops: the same math, other roundings
        assert compiled[step]["loss"] == pytest.approx(eager[step]["loss"], rel=RTOL), step


def job(*overrides: str):
    return to_job(compose_raw(list(overrides)))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["parallel.tp=2", "data.seq_len=63"],
            "parallel.tp=2 does not divide data.seq_len=63: sequence parallelism gives",
        ),
        (
            ["parallel.tp=2", "model=gpt_tiny", "model.vocab_size=257"],
            "parallel.tp=2 does not divide model.vocab_size=257",
        ),
        (
            ["experiment=returns", "parallel.tp=2", "model.num_heads=4"],
            "parallel.tp=2: model ts_transformer has no tensor-parallel plan; give its ModelSpec",
        ),
    ],
    ids=["seq_len", "vocab", "timeseries"],
)
def test_a_layout_tp_cannot_run_is_refused_in_one_line(overrides, message) -> None:
    with pytest.raises(ConfigError) as err:
        validate(job("cluster.tasks_per_node=2", *overrides))
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems
