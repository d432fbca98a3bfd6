"""`python -m toolkit.plan --check K [--spread]`: run plans through the training benchmark and
compare the measured order with the predicted one (toolkit.plan ranks; this runs).

The top K plans often lie within a few per cent of each other, inside a short run's noise;
`spread` picks K plans over the whole ranking instead. The verdict: whether the measured
order is the predicted one, and Spearman's rank correlation."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol, TypeVar


class RankedPlan(Protocol):
    """What a check needs of a plan (toolkit.plan.Plan): its prediction and its overrides."""

    prediction: Any

    def overrides(self) -> list[str]: ...


P = TypeVar("P")


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


def spread(plans: list[P], k: int) -> list[P]:
    """k plans spread over the ranking (the best, the worst and evenly between): their
    predicted differences are large enough for a short run on a noisy machine to tell
    whether the order holds, unlike the top k, which often lie within a few per cent."""
    if k >= len(plans):
        return list(plans)
    if k == 1:
        return plans[:1]
    return [plans[round(i * (len(plans) - 1) / (k - 1))] for i in range(k)]


def check(plans: list[RankedPlan], overrides: list[str], steps: int) -> int:
    """Run the given plans (the top k, or a spread: `spread`) locally through the training
    benchmark; print predicted vs measured, whether the order holds and Spearman's rank
    correlation."""
    from toolkit.measure.run import main as bench

    predicted, measured = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(plans):
            out = Path(tmp) / str(i)
            code = bench(
                [
                    "--warmup",
                    "2",
                    "--steps",
                    str(steps),
                    "--out",
                    str(out),
                    *overrides,
                    *p.overrides(),
                ]
            )
            if code != 0:
                print(f"plan {i + 1}: the run failed (exit {code})", file=sys.stderr)
                return code
            result = json.loads((out / "bench.json").read_text())
            predicted.append(p.prediction.tokens_per_s)
            measured.append(result["tokens_per_s"])
    print("plan | layout | predicted tokens/s | measured tokens/s | measured/predicted")
    for i, (p, pr, me) in enumerate(zip(plans, predicted, measured, strict=True), 1):
        print(f"{i} | {' '.join(p.overrides())} | {pr:,.0f} | {me:,.0f} | {me / pr:.2f}")
    holds = "holds" if rank_agreement(predicted, measured) else "does not hold"
    print(f"predicted order {holds}; Spearman rank correlation {spearman(predicted, measured):.2f}")
    return 0
