"""The pipeline benchmark's baseline (the schedules' bubble formula) and its argument checks;
the measurement itself is a command (docs/BENCHMARKS.md), not a timed test."""

from __future__ import annotations

import pytest

from toolkit.bench.pipeline import bubble_formula, main


def test_bubble_formula_of_each_schedule() -> None:
    assert bubble_formula(2, 4, 1) == pytest.approx(1 / 5)  # GPipe, 1F1B: (p-1)/(m+p-1)
    assert bubble_formula(4, 8, 1) == pytest.approx(3 / 11)
    assert bubble_formula(2, 4, 2) == pytest.approx(1 / 9)  # interleaved: (p-1)/(v*m+p-1)
    assert bubble_formula(1, 4, 1) == 0.0


def test_a_global_batch_that_does_not_split_is_one_line(capsys) -> None:
    assert main(["--global-batch", "6", "--layouts", "dp4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --global-batch=6: must split over 4 dp ranks x 4 micro-batches (dp4)"]
