"""The saved-for-backward accounting of toolkit.bench.ts_kernels, on the meta device (exact
sizes, no compute) at the bench size."""

from __future__ import annotations

import torch

from toolkit.bench.ts_kernels import CASES, FUSED_ON_META, saved_bytes

MIB = 2**20


def test_fused_ops_keep_only_their_statistics_for_the_backward() -> None:
    meta = torch.device("meta")
    kept = {}
    for case in CASES:
        inputs = case.make_inputs("bench", torch.float32, meta)
        kept[case.name] = (
            saved_bytes(case.reference, inputs),
            saved_bytes(FUSED_ON_META[case.name], inputs),
        )
    # norm: 32*256*512*8 fp32 deviations (128 MiB) kept by the reference; the op keeps
    # mean and rstd, 32*256*8 fp32 each (0.5 MiB together).
    assert kept["masked_cross_section_norm"] == (128 * MIB + 3 * 32 * 256 * 8 * 4, MIB // 2)
    # loss: the reference keeps the error (and the Huber branch's masks); the op nothing.
    assert kept["masked_mse_loss"][0] >= 16 * MIB and kept["masked_mse_loss"][1] == 0
    assert kept["masked_huber_loss"][0] >= 16 * MIB and kept["masked_huber_loss"][1] == 0
