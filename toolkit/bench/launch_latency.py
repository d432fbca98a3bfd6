"""Launch-to-first-step latency on Slurm: `toolkit.launch cluster=slurm` vs a hand-written
sbatch + srun script running the same training.

    python -m toolkit.bench.launch_latency [--reps 5] [--nodes 2] [OVERRIDE ...]

Both variants are timed from the moment the command starts until rank 0 finished its first
optimizer step (the wall_time of step 1 in metrics/rank0.jsonl), interleaved A B A B so that
drifting machine load hits both alike. The baseline gets its config.yaml for free (written
before its clock starts), as a hand-written script would have one; the launcher composes,
validates and prepares everything on the clock. Needs a reachable Slurm cluster
(scripts/dev-cluster up && eval "$(scripts/dev-cluster env)").
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from toolkit.events import read_steps
from toolkit.executors import repo_root

TRAINING = [
    "model=gpt_tiny",
    "data=synthetic",
    "trainer.steps=3",
    "trainer.progress=false",
    "trainer.log_every=1",
]

# The baseline: what one writes by hand to run the entrypoint on a prepared run dir.
BASELINE_SBATCH = """#!/bin/bash
#SBATCH --job-name=baseline
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:10:00
#SBATCH --output={run_dir}/slurm-%j.out
export PYTHONPATH={repo}
srun --kill-on-bad-exit=1 {python} -u -m toolkit.entrypoint {run_dir}
"""


def first_step_time(run_dir: Path) -> float:
    return read_steps(run_dir / "metrics" / "rank0.jsonl")[0]["wall_time"]


def run_launcher(run_dir: Path, nodes: int, overrides: list[str]) -> float:
    started = time.time()
    subprocess.run(
        [sys.executable, "-m", "toolkit.launch", "cluster=slurm", f"cluster.nodes={nodes}"]
        + overrides
        + [f"hydra.run.dir={run_dir}"],
        check=True,
        capture_output=True,
        cwd=repo_root(),
    )
    return first_step_time(run_dir) - started


def prepare_baseline(template: Path, run_dir: Path, nodes: int) -> Path:
    """Copy a composed config to a fresh run dir and write the hand-written script (untimed)."""
    run_dir.mkdir(parents=True)
    config = OmegaConf.load(template / "config.yaml")
    config.run_dir = str(run_dir)
    OmegaConf.save(config, run_dir / "config.yaml")
    script = run_dir / "train.sbatch"
    script.write_text(
        BASELINE_SBATCH.format(
            nodes=nodes,
            run_dir=shlex.quote(str(run_dir)),
            repo=shlex.quote(str(repo_root())),
            python=shlex.quote(sys.executable),
        )
    )
    return script


def run_baseline(script: Path) -> float:
    started = time.time()
    subprocess.run(["sbatch", "--wait", str(script)], check=True, capture_output=True)
    return first_step_time(script.parent) - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.launch_latency")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both variants")
    args = parser.parse_args(argv)
    overrides = TRAINING + args.overrides
    work = Path(tempfile.mkdtemp(prefix="launch-latency-"))
    # One untimed launcher run: warms the page cache and gives the baseline its config.
    warmup = work / "warmup"
    run_launcher(warmup, args.nodes, overrides)
    launcher_s, baseline_s = [], []
    for rep in range(args.reps):
        launcher_s.append(run_launcher(work / f"launch-{rep}", args.nodes, overrides))
        script = prepare_baseline(warmup, work / f"baseline-{rep}", args.nodes)
        baseline_s.append(run_baseline(script))
        print(
            f"rep {rep}: launcher {launcher_s[-1]:.2f} s, baseline {baseline_s[-1]:.2f} s",
            flush=True,
        )
    launcher, baseline = statistics.median(launcher_s), statistics.median(baseline_s)
    print(f"launch-to-first-step, median of {args.reps} ({args.nodes} nodes x 1 task):")
    print(f"  toolkit.launch cluster=slurm   {launcher:.2f} s")
    print(f"  hand-written sbatch + srun     {baseline:.2f} s")
    print(f"  ratio                          {launcher / baseline:.2f} (target <= 1.5)")
    print(f"  run dirs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
