"""Your own script under the toolkit vs torchrun: launch-to-first-step and step time.

    python -m toolkit.bench.script_launch [--reps 5] [--steps 200]

Three variants run the same unmodified DDP script (tests/fixtures/scripts/ddp_train.py, gloo,
2 local ranks), interleaved A B C per repetition so that drifting load hits all alike:
  torchrun         the baseline: `torchrun --nproc_per_node=2 ddp_train.py` (BASELINE)
  toolkit          `python -m toolkit.launch script.path=ddp_train.py cluster.tasks_per_node=2`
  toolkit, no agent  the same with telemetry.enabled=false (no node agent, no watchdog)
Each is timed from the command's start until rank 0 prints its first step (read from the
command's own stdout, which rank 0's output reaches in all three); the step time is the time
between the first and the last step's line over the steps between. Medians printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolkit.executors import repo_root

SCRIPT = repo_root() / "tests" / "fixtures" / "scripts" / "ddp_train.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def BASELINE(steps: int, run_dir: Path) -> list[str]:  # noqa: N802 - the baseline, in code
    return [TORCHRUN, "--nproc_per_node=2", str(SCRIPT), "--steps", str(steps)]


def toolkit(steps: int, run_dir: Path, *more: str) -> list[str]:
    return [
        sys.executable, "-m", "toolkit.launch", f"script.path={SCRIPT}",
        f"script.args=[--steps,{steps}]", "cluster.tasks_per_node=2",
        f"hydra.run.dir={run_dir}", *more,
    ]  # fmt: skip


def no_agent(steps: int, run_dir: Path) -> list[str]:
    return toolkit(steps, run_dir, "telemetry.enabled=false")


VARIANTS = {"torchrun": BASELINE, "toolkit": toolkit, "toolkit, no agent": no_agent}


def timed(cmd: list[str], steps: int) -> tuple[float, float]:
    """(seconds from start to rank 0's first step line, seconds per step after it)."""
    started = time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=repo_root()
    )
    first = last = None
    for line in proc.stdout:
        if line.startswith("step "):
            now = time.time()
            first = first or now
            if line.startswith(f"step {steps} "):
                last = now
    if proc.wait() != 0 or first is None or last is None:
        raise RuntimeError(f"{cmd[:4]}... exited {proc.returncode} before its last step")
    return first - started, (last - first) / max(1, steps - 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.script_launch")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="script-launch-"))
    timed(BASELINE(args.steps, work), args.steps)  # untimed: warms the page cache
    first: dict[str, list[float]] = {name: [] for name in VARIANTS}
    step: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for rep in range(args.reps):
        for i, (name, build) in enumerate(VARIANTS.items()):
            f, s = timed(build(args.steps, work / f"rep{rep}-variant{i}"), args.steps)
            first[name].append(f)
            step[name].append(s)
            print(f"rep {rep} {name:18s} first step {f:6.2f} s, step {s * 1e3:7.3f} ms", flush=True)
    med_first = {n: statistics.median(v) for n, v in first.items()}
    med_step = {n: statistics.median(v) for n, v in step.items()}
    print(f"medians of {args.reps} interleaved repetitions, 2 local ranks, {args.steps} steps:")
    for n in VARIANTS:
        print(f"  {n:18s} first step {med_first[n]:6.2f} s   step {med_step[n] * 1e3:7.3f} ms")
    base = med_first["torchrun"]
    print(
        f"  launch-to-first-step ratio, toolkit / torchrun:          {med_first['toolkit'] / base:.2f}"
    )
    print(
        f"  launch-to-first-step ratio, toolkit no agent / torchrun: {med_first['toolkit, no agent'] / base:.2f}"
    )
    print(
        f"  step time ratio, agent on / off:                         {med_step['toolkit'] / med_step['toolkit, no agent']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
