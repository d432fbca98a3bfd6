"""The GPU check's ensemble step (scripts/gpu_check.sh): K members of one small model in one
ensemble step (trainer.ensemble=K: vmap over stacked parameters, one StackedAdamW;
toolkit.train.ensemble) against K separate steps, for K = 1, 8, 32
(toolkit.bench.ensemble, interleaved, medians), and the members' losses against their
separate models' (fp32 with TF32 matmuls off, as the toolkit sets them on CPU-equal
terms: within rel 1e-4). Runs on the CPU too (smaller): its test."""

from __future__ import annotations

import time
from typing import Any

import torch

from toolkit.bench.ensemble import measure, members_match

KS = (1, 8, 32)
MODELS = ("ts_transformer", "mlp")
MATCH_TOLERANCE = 1e-4


def ensemble_step(
    device: torch.device,
    ks: tuple[int, ...] = KS,
    repeats: int = 5,
    steps: int = 5,
    micro_batch: int = 64,
    models: tuple[str, ...] = MODELS,
) -> dict[str, Any]:
    started = time.perf_counter()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # members vs separate: the same fp32 math
    try:
        worst = {m: members_match(m, device) for m in models}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    rows = [measure(k, m, device, micro_batch, repeats, steps) for m in models for k in ks]
    return {
        "rows": rows,
        "members_max_rel_diff": worst,
        "ok": all(w < MATCH_TOLERANCE for w in worst.values()),
        "seconds": time.perf_counter() - started,
    }


def ensemble_summary(result: dict[str, Any]) -> list[str]:
    """One line per model: K -> speedup of one ensemble step over K separate steps."""
    lines = []
    for model in result["members_max_rel_diff"]:
        rows = [r for r in result["rows"] if r["model"] == model]
        speedups = ", ".join(f"K={r['k']}: {r['speedup']:.2f}x" for r in rows)
        lines.append(
            f"{model}: {speedups} (members within {result['members_max_rel_diff'][model]:.1e})"
        )
    return lines
