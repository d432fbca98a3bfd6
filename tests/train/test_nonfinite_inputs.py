"""Where a step's micro-batches hold NaN/inf (the guard asks only after a non-finite loss)."""

import torch

from toolkit.train.nonfinite import nonfinite_in


def test_the_count_and_the_first_place_of_nan_or_inf_in_any_batch_structure():
    x, y = torch.zeros(4, 3), torch.zeros(4)
    assert nonfinite_in([(x, y), {"x": x, "ids": torch.arange(4)}]) == (0, 0, 0)
    bad = x.clone()
    bad[1, 2], bad[3, 0] = float("inf"), float("nan")
    # micro-batch 1's second tensor (the dict's "x": integer ids are never searched)
    assert nonfinite_in([(x, y), {"ids": torch.arange(4), "x": bad}, (bad, y)]) == (4, 1, 1)
