"""Node-failure benchmark: time from a node's failure to the job's first resumed step.

    eval "$(scripts/dev-cluster env)"   # a dev cluster of 3 nodes: scripts/dev-cluster up --nodes 3
    python -m toolkit.bench.node_failure [--reps 3]

Each repetition launches a 2-node job (gpt_tiny, checkpoint every 5 steps; the step-10 save
stalls 5 s so the job holds with step 5 committed), sets n2 DOWN (`scontrol update`), and
follows the job through NODE_FAIL, Slurm's requeue, the launcher's exclusion of n2 (with
StartTime=now) and the resume on n1+n3. Printed per repetition and as medians:
  fail->decided: n2 down until the exclusion is decided (excluded_nodes.json's time)
  decided->start: until rank 0 of the new attempt starts its first step
  fail->first step: until the first resumed step ends (the figure of the issue)

`--cause hang`: rank 1 (on n2) hangs in a collective after step 12 instead (fault.hang_*,
watchdog timeout 10 s); the watchdog dumps every rank's stacks, requeues the job without n2
and the job resumes from its step-10 checkpoint on n1+n3. The hang starts when rank 1 made
its last progress (the summary's time minus stuck_for_s). Printed:
  hang->decided: until the exclusion is decided (timeout + dumps + summary + decision)
  decided->start: until rank 0 of the new attempt starts its first step
  hang->first step: until the first resumed step (step 11) ends
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolkit import slurm_cli

# Measured on the 2-vCPU dev VM (see docs/BENCHMARKS.md); Slurm alone, without StartTime=now,
# holds a requeued job ~120 s before it may start.
BASELINE_FAIL_TO_FIRST_STEP_S = 16.7
SLURM_REQUEUE_HOLD_S = 120.0

# The job (the tiny model, 40 steps, a checkpoint every 5); tests/executors/slurm_jobs.py
# runs the same one in the Slurm tests of node exclusion and preemption.
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

OVERRIDES = [*JOB, *TWO_NODES, *HOLD_AT_STEP_10]


HANG_OVERRIDES = [
    *JOB,
    *TWO_NODES,
    "fault.hang_at_step=12",
    "fault.hang_rank=1",
    "fault.hang_timeout_s=10",
]


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    return slurm_cli.run("scontrol", *args)


def one(run_dir: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "toolkit.launch", *OVERRIDES, f"hydra.run.dir={run_dir}"]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = run_dir / "checkpoints"
    try:
        deadline = time.time() + 180
        while not ((ckpt / "step-00000005").is_dir() and (ckpt / "step-00000010.tmp").is_dir()):
            if time.time() > deadline or launcher.poll() is not None:
                raise RuntimeError("the job did not hold at its step-10 save")
            time.sleep(0.1)
        failed_at = time.time()
        down = _scontrol("update", "NodeName=n2", "State=DOWN", "Reason=bench")
        if down.returncode != 0:
            raise RuntimeError(f"scontrol update NodeName=n2 State=DOWN: {down.stderr.strip()}")
        out, err = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
        _scontrol("update", "NodeName=n2", "State=RESUME")
    if launcher.returncode != 0:
        raise RuntimeError(f"the job failed:\n{err[-2000:]}")
    return _timeline(run_dir, failed_at, resumed_step=6, cause="fail")


def one_hang(run_dir: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "toolkit.launch", *HANG_OVERRIDES, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        actions = [json.loads(p.read_text()).get("action") for p in run_dir.glob("hangs/*/*.json")]
        raise RuntimeError(f"the job failed ({actions}):\n{done.stderr[-2000:]}")
    (summary_path,) = sorted(run_dir.glob("hangs/*/summary.json"))
    summary = json.loads(summary_path.read_text())
    hung_at = float(summary["time_unix"]) - float(summary["stuck_for_s"])
    return _timeline(run_dir, hung_at, resumed_step=11, cause="hang")


def _timeline(run_dir: Path, t0: float, resumed_step: int, cause: str) -> dict[str, float]:
    """From t0 (the failure, the hang) to the exclusion decision and the first resumed step."""
    decided = json.loads((run_dir / "excluded_nodes.json").read_text())["nodes"][0]["time"]
    records = [
        json.loads(x) for x in (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
    ]
    resumed = next(r for r in records if r["wall_time"] > t0 and r["step"] == resumed_step)
    started = resumed["wall_time"] - resumed["step_time_s"]
    return {
        f"{cause}->decided": decided - t0,
        "decided->start": started - decided,
        f"{cause}->first step": resumed["wall_time"] - t0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cause", choices=("down", "hang"), default="down")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-node-failure-") as tmp:
        for i in range(args.reps):
            run = one if args.cause == "down" else one_hang
            row = run(Path(tmp) / f"rep{i}")
            rows.append(row)
            print(f"rep {i}: " + "  ".join(f"{k} {v:.1f} s" for k, v in row.items()), flush=True)
    medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print("median: " + "  ".join(f"{k} {v:.1f} s" for k, v in medians.items()))
    if args.cause == "down":
        print(
            f"baseline fail->first step {BASELINE_FAIL_TO_FIRST_STEP_S:.1f} s (dev VM); a requeue "
            f"left to Slurm alone waits ~{SLURM_REQUEUE_HOLD_S:.0f} s before it may start"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
