"""The GPU check's determinism step (scripts/gpu_check.sh): trainer.deterministic=true makes
two fresh runs with the same seed bitwise equal (every step's loss and gradient norm), and
what it costs: step time on against off, the runs interleaved (on off on ...), medians
after the warm-up steps. Runs on the CPU too, with a tiny model (its test:
tests/distributed/test_determinism.py)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODE = {"on": ["trainer.deterministic=true"], "off": ["trainer.deterministic=false"]}


def launch_run(run_dir: Path, overrides: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """One fresh run through the real launcher (the mode is set in each rank's entrypoint);
    its per-step (loss, grad_norm) and step times, or its error."""
    cmd = [sys.executable, "-m", "toolkit.launch", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    records = [
        json.loads(line)
        for line in (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return {
        "steps": [(r["loss"], r["grad_norm"]) for r in records],
        "step_times_s": [r["step_time_s"] for r in records],
        "said_on": "deterministic mode on" in done.stdout + done.stderr,
    }


def determinism_step(
    out: Path,
    overrides: Sequence[str],
    order: Sequence[str] = ("on", "off", "on", "off"),
    warmup: int = 3,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Fresh runs of `overrides`, the mode on or off in `order` (interleaved); ok when every
    run with the mode on has the same per-step losses and gradient norms, bit for bit, and
    said so in its first lines. The cost: the median step time of each mode (over its runs'
    steps after `warmup`) and their ratio."""
    out.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix="determinism-", dir=out))  # no run dir to resume
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in order}
    for i, mode in enumerate(order):
        runs[mode].append(launch_run(fresh / f"{i}-{mode}", [*overrides, *MODE[mode]], timeout_s))
    errors = [r["error"] for rs in runs.values() for r in rs if "error" in r]
    on = [r for r in runs.get("on", []) if "error" not in r]
    bitwise = len(on) >= 2 and all(r["steps"] == on[0]["steps"] for r in on[1:])
    medians = {}
    for mode, rs in runs.items():
        times = [t for r in rs if "error" not in r for t in r["step_times_s"][warmup:]]
        if times:
            medians[mode] = statistics.median(times)
    result: dict[str, Any] = {
        "ok": bitwise and not errors and all(r["said_on"] for r in on),
        "bitwise_equal": bitwise,
        "runs_on": len(on),
        "median_step_s": medians,
        "errors": errors,
    }
    if "on" in medians and "off" in medians:
        result["on_over_off"] = medians["on"] / medians["off"]
    return result
