"""How toolkit.bench.script_launch reads the script's stamped step lines: the first step is
step 1's stamp after the start, the step time the median gap between consecutive stamps,
and a run whose output lacks a step is refused rather than timed on what is left."""

import pytest

from toolkit.bench.script_launch import first_and_step, stamps

OUTPUT = """\
[rank 0] starting
step 1 loss 1.250000  t=100.500000
step 2 loss 1.100000  t=100.510000
noise from another rank
step 3 loss 0.900000 tag t=100.530000
step 4 loss 0.800000  t=100.540000
"""


def test_the_stamped_lines_give_each_steps_print_time_and_other_lines_are_skipped():
    assert stamps(OUTPUT) == {1: 100.5, 2: 100.51, 3: 100.53, 4: 100.54}
    assert stamps("step 1 loss 1.0 \n") == {}  # a line without --stamp is not a time


def test_first_step_counts_from_the_start_and_step_time_is_the_median_gap():
    first_s, step_s = first_and_step(OUTPUT, started=98.0, steps=4)
    assert first_s == pytest.approx(2.5)
    assert step_s == pytest.approx(0.01)  # gaps 10, 20, 10 ms: the 20 ms outlier does not count


def test_an_output_missing_a_step_is_refused():
    with pytest.raises(RuntimeError, match="expected stamped steps 1..5, got 4"):
        first_and_step(OUTPUT, started=98.0, steps=5)
