"""Your own script under the toolkit vs torchrun: launch-to-first-step and step time.

    python -m toolkit.bench.script_launch [--reps 5] [--steps 200]            # 2 local ranks
    python -m toolkit.bench.script_launch --slurm [--reps 3] [--steps 100]    # 2 Slurm nodes
    python -m toolkit.bench.script_launch --against DIR    # + D: B from an earlier checkout
    python -m toolkit.bench.script_launch --override launch.rank_start=exec    # B, C, D with it

Three variants run the same DDP script (tests/fixtures/scripts/ddp_train.py, gloo), one
untimed warm-up first, then interleaved per repetition with the order rotated each time so
that drifting load hits all alike:
  A  the baseline, what a user writes by hand (in code below: BASELINE, SRUN_BASELINE):
     locally `torchrun --nproc_per_node=2 ddp_train.py`; with --slurm `sbatch --wait -N2` of
     a batch script running `srun --ntasks-per-node=1 torchrun --nnodes=2 --nproc_per_node=1
     --rdzv_backend=c10d --rdzv_endpoint=$head:$port ddp_train.py`
  B  `python -m toolkit.launch script.path=ddp_train.py` with `cluster.tasks_per_node=2`, or
     with --slurm `cluster=slurm cluster.nodes=2` (blocks until the job ends, like A)
  C  B with telemetry.enabled=false (no node agent, no watchdog)
The script's --stamp ends rank 0's step lines with its own time.time() as it prints them.
First step: from the command's start (submission, with --slurm) until the stamp of rank 0's
`step 1` line; the Slurm "nodes" of a dev cluster share this machine's clock (on a real
cluster this needs synchronised clocks). Step time: median of the differences between
consecutive stamps. Both are read from the output after the command ends (locally its
stdout; with --slurm the job's output file, A's slurm-<job>.out, B's and C's
<run dir>/slurm/*_0_log.out), so reading costs the variants nothing. Medians printed.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

from toolkit.executors import repo_root

SCRIPT = repo_root() / "tests" / "fixtures" / "scripts" / "ddp_train.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
# The ranks find this checkout and its Python, local or on Slurm (as jobs/script.sbatch asks).
ENV = dict(os.environ, PYTHONPATH=str(repo_root()), TOOLKIT_PYTHON=sys.executable)
STAMPED = re.compile(r"^step (\d+) loss \S+ .*t=(\d+\.\d+)\s*$")


def script_args(steps: int) -> list[str]:
    return [str(SCRIPT), "--steps", str(steps), "--stamp"]


def BASELINE(steps: int, run_dir: Path) -> list[str]:  # noqa: N802 - the baseline, in code
    return [TORCHRUN, "--nproc_per_node=2", *script_args(steps)]


def SRUN_BASELINE(steps: int, run_dir: Path) -> list[str]:  # noqa: N802 - the baseline, in code
    """`sbatch --wait` of the batch script a user writes for torchrun on 2 nodes by hand."""
    run_dir.mkdir(parents=True)
    with socket.socket() as s:  # a port free here; the dev cluster's nodes share this host
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    batch = run_dir / "torchrun.sbatch"
    batch.write_text(
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        f"srun --ntasks-per-node=1 {TORCHRUN} --nnodes=2 --nproc_per_node=1 "
        f"--rdzv_backend=c10d --rdzv_endpoint=$head:{port} --rdzv_id=$SLURM_JOB_ID "
        + " ".join(script_args(steps))
        + "\n"
    )
    return ["sbatch", "--wait", "-N2", "--ntasks-per-node=1", "--time=00:05:00",
            f"--output={run_dir}/slurm-%j.out", str(batch)]  # fmt: skip


def toolkit(steps: int, run_dir: Path, *more: str) -> list[str]:
    args = ",".join(script_args(steps)[1:])
    return [
        sys.executable, "-m", "toolkit.launch", f"script.path={SCRIPT}", f"script.args=[{args}]",
        f"hydra.run.dir={run_dir}", *more,
    ]  # fmt: skip


SLURM = ["cluster=slurm", "cluster.nodes=2", "cluster.time=00:05:00"]
Variant = Callable[[int, Path], list[str]]
LOCAL: dict[str, Variant] = {
    "A torchrun": BASELINE,
    "B toolkit": lambda n, d: toolkit(n, d, "cluster.tasks_per_node=2"),
    "C toolkit, no agent": lambda n, d: toolkit(
        n, d, "cluster.tasks_per_node=2", "telemetry.enabled=false"
    ),
}
ON_SLURM: dict[str, Variant] = {
    "A sbatch+srun torchrun": SRUN_BASELINE,
    "B toolkit": lambda n, d: toolkit(n, d, *SLURM),
    "C toolkit, no agent": lambda n, d: toolkit(n, d, *SLURM, "telemetry.enabled=false"),
}


def _with(variant: Variant, overrides: list[str]) -> Variant:
    return lambda n, d: [*variant(n, d), *overrides]


def stamps(text: str) -> dict[int, float]:
    """Step -> the time rank 0 printed it, from the script's `--stamp` lines in `text`."""
    return {int(m[1]): float(m[2]) for m in map(STAMPED.match, text.splitlines()) if m}


def first_and_step(text: str, started: float, steps: int) -> tuple[float, float]:
    """(seconds from `started` to step 1's line, median seconds between consecutive steps)."""
    times = stamps(text)
    if sorted(times) != list(range(1, steps + 1)):
        raise RuntimeError(f"expected stamped steps 1..{steps}, got {len(times)} of them")
    ordered = [times[s] for s in range(1, steps + 1)]
    return times[1] - started, statistics.median(b - a for a, b in pairwise(ordered))


def output_of(run_dir: Path, stdout: str) -> str:
    """Where rank 0's lines went: the command's stdout, else the Slurm job's output files."""
    files = [*run_dir.glob("slurm-*.out"), *run_dir.glob("slurm/*_0_log.out")]
    return stdout + "".join(p.read_text() for p in files)


def timed(
    cmd: list[str], run_dir: Path, steps: int, tree: Path | None = None
) -> tuple[float, float]:
    """Run `cmd` (from the checkout `tree`, this one by default) and read its figures."""
    tree = tree or repo_root()
    env = dict(ENV, PYTHONPATH=str(tree))
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:4])}... exited {done.returncode}: {done.stderr[-2000:]}"
        )
    return first_and_step(output_of(run_dir, done.stdout), started, steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.script_launch")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--slurm", action="store_true", help="2 nodes of the Slurm cluster SLURM_CONF names"
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="a checkout of an earlier commit (git archive REV | tar -x -C DIR): its B, "
        "interleaved with the others as D, for a before/after figure in one run",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="one more toolkit.launch override for B, C and D (repeatable), e.g. "
        "launch.rank_start=exec: every rank its own interpreter, as on a GPU machine",
    )
    args = parser.parse_args(argv)
    variants = {
        name: (v if name.startswith("A ") else _with(v, args.override))
        for name, v in (ON_SLURM if args.slurm else LOCAL).items()
    }
    trees: dict[str, Path] = {}
    if args.against is not None:
        variants["D toolkit at --against"] = variants["B toolkit"]
        trees["D toolkit at --against"] = args.against.resolve()
    names = list(variants)
    work = Path(tempfile.mkdtemp(prefix="script-launch-"))
    timed(variants[names[0]](args.steps, work / "warmup"), work / "warmup", args.steps)
    first: dict[str, list[float]] = {name: [] for name in names}
    step: dict[str, list[float]] = {name: [] for name in names}
    n = len(names)
    for rep in range(args.reps):
        for name in names[rep % n :] + names[: rep % n]:  # the order rotated each repetition
            run_dir = work / f"rep{rep}-{name[0]}"
            cmd = variants[name](args.steps, run_dir)
            f, s = timed(cmd, run_dir, args.steps, trees.get(name))
            first[name].append(f)
            step[name].append(s)
            print(f"rep {rep} {name:22s} first step {f:6.2f} s, step {s * 1e3:7.3f} ms", flush=True)
    where = "2 Slurm nodes x 1 rank" if args.slurm else "2 local ranks"
    print(f"medians of {args.reps} interleaved repetitions, {where}, {args.steps} steps:")
    med_first = {n: statistics.median(v) for n, v in first.items()}
    med_step = {n: statistics.median(v) for n, v in step.items()}
    for n in names:
        spread = f"{min(step[n]) * 1e3:.3f}-{max(step[n]) * 1e3:.3f}"
        print(
            f"  {n:22s} first step {med_first[n]:6.2f} s   step {med_step[n] * 1e3:7.3f} ms"
            f" (reps {spread})"
        )
    a, b, c = names[:3]
    for other in names[1:]:
        print(f"  launch-to-first-step ratio {other[0]}/A: {med_first[other] / med_first[a]:.2f}")
    print(f"  step time ratio B/C (agent on / off): {med_step[b] / med_step[c]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
