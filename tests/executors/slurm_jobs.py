"""What the Slurm job tests share (test_node_exclusion.py, test_preemption.py): the job they
run (the one the node-failure figures of docs/BENCHMARKS.md were measured with), and reading
and waiting on its run directory."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The job (the tiny model, 40 steps, a checkpoint every 5).
STEPS = 40
JOB = [
    "model=gpt_tiny",
    "data=text",
    "data.seq_len=32",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=8",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "checkpoint.enabled=true",
    "checkpoint.interval_steps=5",
]
TWO_NODES = ["cluster=slurm", "cluster.nodes=2", "cluster.time=00:10:00"]
# The step-10 save's writer sleeps 5 s per file: the job holds at step 15 with step 5
# committed, long enough to take n2 away mid-run (losses are unaffected).
HOLD_AT_STEP_10 = ["fault.save_stall_step=10", "fault.save_stall_s=5"]

__all__ = ["HOLD_AT_STEP_10", "JOB", "STEPS", "TWO_NODES", "events", "losses", "wait_for"]


def losses(run_dir: Path) -> dict[int, float]:
    """Loss per step from rank 0's metrics ({} before there are any); a resumed attempt's
    steps overwrite the first's."""
    out: dict[int, float] = {}
    path = run_dir / "metrics" / "rank0.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]
    return out


def events(run_dir: Path, name: str) -> list[dict]:
    """Rank 0's events called `name`, oldest first ([] before there are any)."""
    path = run_dir / "metrics" / "events-rank0.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["name"] == name]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> None:
    """Poll `predicate` until it is true; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
