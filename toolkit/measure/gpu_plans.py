"""The GPU check's planner step (toolkit.measure.gpu): does the planner's ranking hold here?

The planner (toolkit.perfmodel.planner) ranks the layouts of gpt_1b on the device's hardware preset,
1 node x 1 GPU, bf16, a global batch of 8 sequences x 2048 tokens (the model's max_seq_len).
At world size 1 the layouts differ in micro-batch x accumulation, activation checkpointing,
reshard_after_forward and, with accumulation, grad_sync and reshard_between_micro_steps.
K picks spread over the ranking (toolkit.perfmodel.planner.spread: the best, the worst, evenly between, so
that their predicted differences exceed a short run's noise) each run eagerly for
PICK_WARMUP + PICK_STEPS steps through the training benchmark (plan_check.run_plan, i.e.
toolkit.measure.run, the launcher path of the check's other runs), training capped at
PICK_RUN_BUDGET_S. Per pick: predicted vs measured step time and tokens/s and their ratio;
over the picks: whether the measured order is the predicted one, and Spearman's rank
correlation.

A prediction that is off is reported, not failed: the step fails only when a pick's run
fails (or the planner raises). Picks left out by the start deadline are reported as
skipped. The memory options (model.kernels=liger, optim=adamw8bit) are not enumerated: the
model gives them the default's step time, so they would add only ties to the order, and
their code (Triton kernels, torchao) need not be on the lent machine.

Time on an H200 (an estimate; this step has not run on a GPU yet): per pick the run's
start-up (~20 s, gpu.py's figure: ranks, the 1.3B model built, telemetry) plus
PICK_WARMUP + PICK_STEPS = 13 steps at the predicted 0.30 s (best), 0.41 s (middle) and
0.59 s (worst) per step, i.e. 4-8 s, plus the analysis: about 30 s a pick, 1.5-2 minutes
for 3 (twice the predicted step times would add ~17 s). No pick starts after the deadline.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the planner is imported when the step runs, not by the no-CUDA path
    from toolkit.perfmodel import Layout
    from toolkit.perfmodel.planner import Plan

MODEL = "gpt_1b"
GLOBAL_BATCH = 8  # sequences per step: 16,384 tokens; micro-batches 8, 4, 2, 1
ONE_GPU = ["cluster.nodes=1", "cluster.gpus_per_node=1", "cluster.tasks_per_node=1"]
DEFAULT_PICKS = 3
PICK_WARMUP = 3
PICK_STEPS = 10
PICK_RUN_BUDGET_S = 60  # per pick, from the start of training (eager: no compile inside)
# No pick starts after this many seconds of the whole check: the worst case is the last pick
# starting at 540 s, ~20 s of start-up and 60 s of training, ending by about 10.5 minutes.
PLANS_START_BUDGET_S = 540.0
# Run settings that are no part of the layout: what every pick runs with.
RUN_SETTINGS = [
    "data=synthetic",
    "parallel.compile=false",
    f"trainer.time_budget_s={PICK_RUN_BUDGET_S}",
]

# (overrides, run directory) -> (exit code, the run's summary or None): plan_check.run_plan
Runner = Callable[[list[str], Path], tuple[int, dict[str, Any] | None]]


@dataclass(frozen=True)
class Pick:
    """One planned layout to run: its place in the ranking and everything its run needs."""

    rank: int  # 1 = the planner's fastest
    plan: Plan
    overrides: list[str]  # what was planned for, RUN_SETTINGS, then the plan's own


@dataclass(frozen=True)
class Ranking:
    """What the planner planned for, how many layouts it ranked, and the picks."""

    planned: list[str]
    num_ranked: int
    picks: list[Pick]


def picks_count(text: str) -> int:
    """--plan-picks' value: a whole number of picks, at least 1."""
    value = int(text)  # not a number: argparse says "invalid picks_count value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    """The step's command-line options on the GPU check's parser."""
    parser.add_argument("--no-plans", action="store_true", help="skip the planner's picks")
    parser.add_argument(
        "--plan-picks",
        type=picks_count,
        default=DEFAULT_PICKS,
        help="layouts spread over the planner's ranking to run (the best, the worst, between)",
    )
    parser.add_argument(
        "--plans-budget-s",
        type=float,
        default=PLANS_START_BUDGET_S,
        help="start no planner pick after this (seconds since the check started)",
    )


def planning_overrides(preset: str) -> list[str]:
    """What the planner ranks layouts for: gpt_1b, bf16, on one GPU of `preset`."""
    return [
        f"model={MODEL}",
        f"hardware={preset}",
        "precision=bf16",
        *ONE_GPU,
        f"trainer.global_batch_size={GLOBAL_BATCH}",
    ]


def pick_plans(preset: str, k: int) -> Ranking:
    """k picks spread over the planner's ranking, best first, planned the way
    `python -m toolkit.plan` plans (toolkit.perfmodel.planner.plan_job: its defaults add the model's
    sequence length), without the memory options."""
    from toolkit.perfmodel.planner import plan_job, spread

    planning = plan_job(planning_overrides(preset), with_memory_options=False)
    if planning is None:  # its problems are on stderr already
        raise ValueError(f"the planned job does not compose: {planning_overrides(preset)}")
    plans, overrides = planning.plans, planning.overrides
    ranks = spread(list(range(len(plans))), k)
    picks = [
        Pick(i + 1, plans[i], [*overrides, *RUN_SETTINGS, *plans[i].overrides()]) for i in ranks
    ]
    return Ranking(overrides, len(plans), picks)


def layout_label(lay: Layout) -> str:
    """The one-GPU layout in a few words (tp, pp and replicas are all 1 here)."""

    def on(flag: bool) -> str:
        return "on" if flag else "off"

    parts = [
        f"mbs {lay.micro_batch_size} x accum {lay.grad_accum}",
        f"AC {on(lay.activation_checkpointing)}",
        f"reshard_after_forward {on(lay.reshard_after_forward)}",
    ]
    if lay.grad_accum > 1:
        parts += [
            f"grad_sync {lay.grad_sync}",
            f"reshard between micro-steps {on(lay.reshard_between_micro_steps)}",
        ]
    return ", ".join(parts)


def pick_record(pick: Pick) -> dict[str, Any]:
    """A pick's prediction, before its run: the JSON fields the run's result joins."""
    pr = pick.plan.prediction
    return {
        "rank": pick.rank,
        "layout": layout_label(pick.plan.layout),
        "overrides": pick.plan.overrides(),
        "predicted_step_s": pr.step_s,
        "predicted_tokens_per_s": pr.tokens_per_s,
        "predicted_peak_memory_bytes": pr.memory["peak_bytes"],
    }


def run_pick(pick: Pick, out: Path, runner: Runner) -> dict[str, Any]:
    """Run one pick into `out`; its record with the measured step time, tokens/s and their
    ratio to the prediction (measured/predicted tokens/s), the peak memory growth over the
    memory in use before the model was built against the predicted peak (as gpu.py
    compares it for its runs), or the failure."""
    record = pick_record(pick)
    t0 = time.perf_counter()
    code, result = runner(pick.overrides, out)
    record.update(exit_code=code, seconds=time.perf_counter() - t0, run_dir=str(out))
    if result is None:
        record["reason"] = f"exit {code}; logs in {out / 'logs'}"
        return record
    record.update(
        measured_step_s=result["step_time_s_median"],
        measured_tokens_per_s=result["tokens_per_s"],
        measured_peak_memory_growth_bytes=result["peak_memory_growth_bytes"],
        ratio=result["tokens_per_s"] / record["predicted_tokens_per_s"],
    )
    growth = result["peak_memory_growth_bytes"]
    record["memory_ratio"] = growth / record["predicted_peak_memory_bytes"] if growth else None
    return record


def order_verdict(picks: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the measured picks keep the predicted order, and Spearman's rank correlation
    (None for both with fewer than two measured picks)."""
    from toolkit.measure.plan_check import rank_agreement, spearman

    measured = [p for p in picks if "measured_tokens_per_s" in p]
    if len(measured) < 2:
        return {"order_holds": None, "spearman": None, "compared": len(measured)}
    predicted = [p["predicted_tokens_per_s"] for p in measured]
    tokens = [p["measured_tokens_per_s"] for p in measured]
    return {
        "order_holds": rank_agreement(predicted, tokens),
        "spearman": spearman(predicted, tokens),
        "compared": len(measured),
    }


def default_runner(overrides: list[str], out: Path) -> tuple[int, dict[str, Any] | None]:
    from toolkit.measure.plan_check import run_plan

    return run_plan(overrides, out, PICK_STEPS, PICK_WARMUP)


def plan_step(
    preset: str | None, k: int, out: Path, deadline: float, runner: Runner = default_runner
) -> dict[str, Any]:
    """The step's report section: the plan it ran for, one record per pick and the verdict.
    No pick starts after `deadline` (a time.perf_counter() value)."""
    if preset is None:
        return {"skipped": "no hardware preset for this device (the planner needs one)"}
    section: dict[str, Any] = {"model": MODEL, "hardware": preset, "precision": "bf16"}
    try:
        ranking = pick_plans(preset, k)
    except Exception as exc:  # noqa: BLE001 - reported as the step's failure, the rest stands
        return {**section, "error": f"planner: {type(exc).__name__}: {exc}"}
    section.update(planned=ranking.planned, ranked=ranking.num_ranked, picks=[])
    if not ranking.picks:
        return {**section, "error": "planner: no layout fits in memory"}
    for pick in ranking.picks:
        if time.perf_counter() > deadline:
            section["picks"].append({**pick_record(pick), "reason": "time budget spent"})
            continue
        section["picks"].append(run_pick(pick, out / f"rank{pick.rank:03d}", runner))
    section.update(order_verdict(section["picks"]))
    return section


def plans_ok(section: dict[str, Any]) -> bool:
    """False when the planner raised or a pick's run failed; off predictions and skipped
    picks pass (they are reported)."""
    if "error" in section:
        return False
    return not any(p.get("exit_code", 0) != 0 for p in section.get("picks", []))


def pick_row(p: dict[str, Any], num_ranked: int) -> tuple[str, str, str]:
    """One pick's row of the summary table: measured tokens/s; predicted vs measured."""
    label = f"plan #{p['rank']} of {num_ranked}"
    predicted = (
        f"predicted {p['predicted_tokens_per_s']:,.0f} tok/s, "
        f"{1000 * p['predicted_step_s']:,.0f} ms/step"
    )
    if "measured_tokens_per_s" not in p:
        failed = p.get("exit_code", 0) != 0
        return label, "FAILED" if failed else "skipped", f"{p['reason']}; {p['layout']}"
    return (
        label,
        f"{p['measured_tokens_per_s']:,.0f} tok/s",
        f"{predicted}; measured {1000 * p['measured_step_s']:,.0f} ms/step, "
        f"meas/pred {p['ratio']:.2f}; memory meas/pred "
        + (f"{p['memory_ratio']:.2f}" if p["memory_ratio"] else "-")
        + f"; {p['layout']}",
    )


def plan_rows(section: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The step's rows of the GPU check's summary table: one per pick, then the verdict."""
    if "skipped" in section:
        return [("planner picks", "skipped", section["skipped"])]
    if "error" in section:
        return [("planner picks", "FAILED", section["error"])]
    rows = [pick_row(p, section["ranked"]) for p in section["picks"]]
    what = f"{section['model']} on 1 x {section['hardware']}, {section['precision']}"
    if section["order_holds"] is None:
        verdict, detail = "-", f"{section['compared']} pick(s) measured; the order needs 2"
    else:
        verdict = "holds" if section["order_holds"] else "does not hold"
        detail = f"Spearman {section['spearman']:.2f} over {section['compared']} picks"
    return [*rows, ("planner order", verdict, f"{what}: {detail}")]
