"""The GPU check's planner step on CPU: which layouts it picks from the real planner, the
runs they compose into, and how predicted vs measured is judged and shown. The runs are
stood in for by a runner that returns given results; the real runs need a CUDA GPU
(tests/measure/test_gpu_check.py, marked gpu)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from tests.measure.test_gpu_check import h200_report, rendered_summary
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.shape import world_size
from toolkit.measure.gpu import main as gpu_check
from toolkit.measure.gpu_plans import Ranking, pick_plans, plan_rows, plan_step, plans_ok
from toolkit.perfmodel.job import layout_from_job

FAR_FUTURE = float("inf")  # a deadline no pick reaches


@pytest.fixture(scope="module")
def h200_ranking():
    return pick_plans("h200", 3)


def test_three_picks_spread_from_the_best_to_the_worst_of_gpt_1b_on_one_h200(h200_ranking):
    picks = h200_ranking.picks
    # the best, one between and the worst of every layout the planner ranked
    best, between, worst = (p.rank for p in picks)
    assert (best, worst) == (1, h200_ranking.num_ranked) and 1 < between < worst
    tokens_per_s = [p.plan.prediction.tokens_per_s for p in picks]
    assert tokens_per_s == sorted(tokens_per_s, reverse=True) and len(set(tokens_per_s)) == 3
    # at world size 1 what differs is micro-batch x accumulation and activation checkpointing
    layouts = {
        (p.plan.layout.micro_batch_size, p.plan.layout.activation_checkpointing) for p in picks
    }
    assert len(layouts) == 3
    assert all(p.plan.layout.world_size == 1 for p in picks)
    # far enough apart for a short run on a noisy machine to tell the order
    assert tokens_per_s[0] > 1.5 * tokens_per_s[-1]


def test_each_pick_runs_gpt_1b_bf16_eagerly_on_one_h200_with_synthetic_data(h200_ranking):
    for pick in h200_ranking.picks:
        for needed in (
            "model=gpt_1b",
            "hardware=h200",
            "precision=bf16",
            "cluster.tasks_per_node=1",
            "data.seq_len=2048",  # the planner's default: the model's max_seq_len
            "data=synthetic",
            "parallel.compile=false",  # the model predicts eager steps
            "trainer.time_budget_s=60",
        ):
            assert needed in pick.overrides
        assert pick.overrides[-len(pick.plan.overrides()) :] == pick.plan.overrides()


def test_a_picks_overrides_compose_into_the_layout_the_planner_predicted(h200_ranking):
    from toolkit.config.validate import problems
    from toolkit.launch import RUNTIME_CHECKS

    for pick in h200_ranking.picks:
        job = to_job(compose_raw(pick.overrides))
        assert world_size(job.cluster) == 1
        assert layout_from_job(job) == pick.plan.layout  # the run is what was predicted
        assert problems(job, RUNTIME_CHECKS) == []  # the launcher would start it
        assert (job.precision.name, job.hardware.name, job.parallel.compile) == (
            "bf16",
            "h200",
            False,
        )


class GivenResults:
    """A runner that stands in for the training benchmark: each run's measured tokens/s is
    a factor of its pick's prediction (None: the run fails), in the order the picks run."""

    def __init__(self, ranking: Ranking, factors: list[float | None]):
        self.picks = {tuple(p.overrides): p for p in ranking.picks}
        self.factors = list(factors)
        self.calls: list[list[str]] = []

    def __call__(self, overrides: list[str], out: Path) -> tuple[int, dict[str, Any] | None]:
        self.calls.append(overrides)
        factor = self.factors[len(self.calls) - 1]
        if factor is None:
            return 1, None
        pick = self.picks[tuple(overrides)]  # the runner is given the pick's own overrides
        tokens = pick.plan.prediction.tokens_per_s * factor
        return 0, {
            "tokens_per_s": tokens,
            "step_time_s_median": pick.plan.prediction.tokens_per_step / tokens,
            "peak_memory_growth_bytes": 1.05 * pick.plan.prediction.memory["peak_bytes"],
        }


def test_an_off_prediction_is_reported_not_failed(tmp_path, h200_ranking):
    # measured at 80 %, 55 % and 95 % of the prediction: the middle pick is slower than the
    # worst, so the predicted order does not hold; nothing failed, so the step passes
    runner = GivenResults(h200_ranking, [0.8, 0.55, 0.95])
    section = plan_step("h200", 3, tmp_path, FAR_FUTURE, runner)
    assert [round(p["ratio"], 2) for p in section["picks"]] == [0.8, 0.55, 0.95]
    assert [round(p["memory_ratio"], 2) for p in section["picks"]] == [1.05] * 3
    assert section["order_holds"] is False
    assert section["spearman"] == pytest.approx(0.5)  # ranks (0,1,2) vs (0,2,1)
    assert plans_ok(section)
    assert json.loads(json.dumps(section))["picks"][0]["run_dir"] == str(tmp_path / "rank001")


def test_a_failed_pick_fails_the_step_and_the_rest_are_still_compared(tmp_path, h200_ranking):
    runner = GivenResults(h200_ranking, [0.9, None, 0.9])
    section = plan_step("h200", 3, tmp_path, FAR_FUTURE, runner)
    assert not plans_ok(section)
    failed = section["picks"][1]
    run_dir = tmp_path / f"rank{failed['rank']:03d}"
    assert (failed["exit_code"], failed["reason"]) == (1, f"exit 1; logs in {run_dir / 'logs'}")
    assert (section["compared"], section["order_holds"], section["spearman"]) == (2, True, 1.0)


def test_picks_past_the_deadline_are_skipped_without_running(tmp_path, h200_ranking):
    runner = GivenResults(h200_ranking, [1.0, 1.0])
    section = plan_step("h200", 2, tmp_path, deadline=0.0, runner=runner)
    assert runner.calls == []
    assert [p["reason"] for p in section["picks"]] == ["time budget spent"] * 2
    assert section["order_holds"] is None and plans_ok(section)


def test_a_gpu_without_a_hardware_preset_skips_the_step(tmp_path, h200_ranking):
    section = plan_step(None, 3, tmp_path, FAR_FUTURE, GivenResults(h200_ranking, [1.0]))
    assert section == {"skipped": "no hardware preset for this device (the planner needs one)"}
    assert plans_ok(section)


# -- the summary table and gpu_check.json, from given results -------------------------------
MEASURED = {
    "model": "gpt_1b",
    "hardware": "h200",
    "precision": "bf16",
    "ranked": 52,
    "picks": [
        {
            "rank": 1,
            "layout": "mbs 8 x accum 1, AC off, reshard_after_forward off",
            "predicted_step_s": 0.303,
            "predicted_tokens_per_s": 54_000.0,
            "exit_code": 0,
            "measured_step_s": 0.341,
            "measured_tokens_per_s": 48_000.0,
            "ratio": 48_000 / 54_000,
            "memory_ratio": 1.04,
        },
        {
            "rank": 52,
            "layout": "mbs 1 x accum 8, AC on, reshard_after_forward on",
            "predicted_step_s": 0.593,
            "predicted_tokens_per_s": 27_600.0,
            "exit_code": 0,
            "measured_step_s": 0.585,
            "measured_tokens_per_s": 28_000.0,
            "ratio": 28_000 / 27_600,
            "memory_ratio": None,
        },
        {
            "rank": 27,
            "layout": "mbs 4 x accum 2, AC on",
            "predicted_step_s": 0.407,
            "predicted_tokens_per_s": 40_200.0,
            "exit_code": 1,
            "reason": "exit 1; logs in L",
        },
    ],
    "order_holds": True,
    "spearman": 1.0,
    "compared": 2,
}


def rendered(rows: list[tuple[str, str, str]]) -> list[str]:
    console = Console(width=400, record=True)
    for row in rows:
        console.print(" | ".join(row))
    return console.export_text().splitlines()


def test_each_pick_shows_predicted_vs_measured_and_the_verdict_follows():
    lines = rendered(plan_rows(MEASURED))
    assert lines == [
        "plan #1 of 52 | 48,000 tok/s | predicted 54,000 tok/s, 303 ms/step; measured 341 "
        "ms/step, meas/pred 0.89; memory meas/pred 1.04; mbs 8 x accum 1, AC off, "
        "reshard_after_forward off",
        "plan #52 of 52 | 28,000 tok/s | predicted 27,600 tok/s, 593 ms/step; measured 585 "
        "ms/step, meas/pred 1.01; memory meas/pred -; mbs 1 x accum 8, AC on, "
        "reshard_after_forward on",
        "plan #27 of 52 | FAILED | exit 1; logs in L; mbs 4 x accum 2, AC on",
        "planner order | holds | gpt_1b on 1 x h200, bf16: Spearman 1.00 over 2 picks",
    ]


def test_a_skipped_or_failed_step_is_one_row():
    assert plan_rows({"skipped": "--no-plans"}) == [("planner picks", "skipped", "--no-plans")]
    assert plan_rows({"error": "planner: no layout fits in memory"}) == [
        ("planner picks", "FAILED", "planner: no layout fits in memory")
    ]
    one = {**MEASURED, "picks": MEASURED["picks"][:1], "order_holds": None, "compared": 1}
    assert rendered(plan_rows(one))[-1] == (
        "planner order | - | gpt_1b on 1 x h200, bf16: 1 pick(s) measured; the order needs 2"
    )


def test_the_gpu_checks_summary_table_carries_the_planner_rows():
    no_rows = {"samples": 0, "runs": 0, "runs_with_samples": 0}
    text = rendered_summary(h200_report([], no_rows, plans=MEASURED), width=400)
    assert "plan #1 of 52" in text and "meas/pred 0.89" in text
    assert "Spearman 1.00 over 2 picks" in text


# -- the command line ---------------------------------------------------------------------------
def test_plan_picks_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check(["--plan-picks", "0"])
    assert exit_.value.code == 2
    assert "argument --plan-picks: 0: must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_the_plan_options_run_nothing(tmp_path, capsys):
    assert gpu_check(["--out", str(tmp_path / "gpu"), "--plan-picks", "2"]) == 0
    assert "nothing was run" in capsys.readouterr().out
    assert not (tmp_path / "gpu").exists()
