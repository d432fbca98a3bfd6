"""The GPU check's ensemble step (scripts/gpu_check.sh): K members of one small model in one
ensemble step (trainer.ensemble=K: vmap over stacked parameters, one StackedAdamW;
toolkit.train.ensemble) against K separate steps, for K = 1, 8, 32, and the members' losses
against their separate models' in fp32 (within rel 1e-4): `toolkit bench ensemble
--check-members` in its own process per model (product code imports no benchmark).
Runs on the CPU too (smaller): its test."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

KS = (1, 8, 32)
MODELS = ("ts_transformer", "mlp")
MATCH_TOLERANCE = 1e-4
TIMEOUT_S = 300


def ensemble_step(
    out: Path,
    device: torch.device,
    ks: tuple[int, ...] = KS,
    repeats: int = 5,
    steps: int = 5,
    micro_batch: int = 64,
    models: tuple[str, ...] = MODELS,
) -> dict[str, Any]:
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"rows": [], "members_max_rel_diff": {}, "errors": {}}
    for model in models:
        report = out / f"ensemble-{model}.json"
        command = [sys.executable, "-m", "toolkit.bench.ensemble", "--check-members"]
        command += ["--model", model, "--device", str(device), "--ks", ",".join(map(str, ks))]
        command += ["--repeats", str(repeats), "--steps", str(steps)]
        command += ["--micro-batch", str(micro_batch), "--json", str(report)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        if done.returncode != 0:
            result["errors"][model] = done.stderr[-2000:]
            continue
        found = json.loads(report.read_text())
        result["rows"] += found["rows"]
        result["members_max_rel_diff"][model] = found["members_max_rel_diff"]
    worst = result["members_max_rel_diff"].values()
    result["ok"] = not result["errors"] and all(w < MATCH_TOLERANCE for w in worst)
    result["seconds"] = time.perf_counter() - started
    return result


def ensemble_summary(result: dict[str, Any]) -> list[str]:
    """One line per model: K -> speed-up of one ensemble step over K separate steps."""
    lines = [
        f"{model}: failed: {error.strip().splitlines()[-1] if error.strip() else '?'}"
        for model, error in result["errors"].items()
    ]
    for model, worst in result["members_max_rel_diff"].items():
        rows = [r for r in result["rows"] if r["model"] == model]
        speedups = ", ".join(f"K={r['k']}: {r['speedup']:.2f}x" for r in rows)
        lines.append(f"{model}: {speedups} (members within {worst:.1e})")
    return lines
