"""`python -m toolkit.plan --check K [--spread]`: run plans through the training benchmark and
compare the measured order with the predicted one (toolkit.plan ranks; this runs).

The top K plans often lie within a few per cent of each other, inside a short run's noise;
`--spread` (toolkit.perfmodel.planner.spread) picks K plans over the whole ranking instead. The verdict:
whether the measured order is the predicted one, and Spearman's rank correlation. run_plan
runs one plan; the GPU check's planner step (toolkit.measure.gpu_plans) runs its picks
with it too."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol


class RankedPlan(Protocol):
    """What a check needs of a plan (toolkit.perfmodel.planner.Plan): its prediction and its overrides."""

    prediction: Any

    def overrides(self) -> list[str]: ...


def rank_agreement(predicted: list[float], measured: list[float]) -> bool:
    """Whether the measured tokens/s keep the predicted order (fastest first)."""
    order = sorted(range(len(measured)), key=lambda i: -measured[i])
    return order == sorted(range(len(predicted)), key=lambda i: -predicted[i])


def spearman(predicted: list[float], measured: list[float]) -> float:
    """Spearman's rank correlation (no ties expected in tokens/s): 1 when the measured order
    is the predicted one, -1 when reversed."""
    n = len(predicted)
    if n < 2:
        return 1.0

    def ranks(values: list[float]) -> list[int]:
        order = sorted(range(n), key=lambda i: -values[i])
        out = [0] * n
        for rank, i in enumerate(order):
            out[i] = rank
        return out

    d2 = sum((a - b) ** 2 for a, b in zip(ranks(predicted), ranks(measured), strict=True))
    return 1.0 - 6.0 * d2 / (n * (n * n - 1))


def run_plan(
    overrides: list[str], out: Path, steps: int, warmup: int = 2
) -> tuple[int, dict[str, Any] | None]:
    """Run one plan through the training benchmark into `out`: `overrides` are what the
    plans were made for followed by the plan's own (Plan.overrides(), last so that they
    win). (exit code, the run's one-line summary bench.json; None when it failed)."""
    from toolkit.measure.run import main as bench

    argv = ["--warmup", str(warmup), "--steps", str(steps), "--out", str(out), *overrides]
    code = bench(argv)
    if code != 0 or not (out / "bench.json").exists():
        return code, None
    return code, json.loads((out / "bench.json").read_text())


def check(plans: list[RankedPlan], overrides: list[str], steps: int) -> int:
    """Run the given plans (the top k, or a spread: toolkit.perfmodel.planner.spread) locally through the
    training benchmark; print predicted vs measured, whether the order holds and Spearman's rank
    correlation."""
    predicted, measured = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(plans):
            code, result = run_plan([*overrides, *p.overrides()], Path(tmp) / str(i), steps)
            if result is None:
                print(f"plan {i + 1}: the run failed (exit {code}, no result)", file=sys.stderr)
                return code or 1
            predicted.append(p.prediction.tokens_per_s)
            measured.append(result["tokens_per_s"])
    print("plan | layout | predicted tokens/s | measured tokens/s | measured/predicted")
    for i, (p, pr, me) in enumerate(zip(plans, predicted, measured, strict=True), 1):
        print(f"{i} | {' '.join(p.overrides())} | {pr:,.0f} | {me:,.0f} | {me / pr:.2f}")
    holds = "holds" if rank_agreement(predicted, measured) else "does not hold"
    print(f"predicted order {holds}; Spearman rank correlation {spearman(predicted, measured):.2f}")
    return 0
