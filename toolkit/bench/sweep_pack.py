"""`python -m toolkit.bench.sweep_pack [--lrs ...] [--seeds ...] [--steps N] [--repeats R]
[--slurm]`: the wall time of a learning-rate x seed sweep of a small TCN, packed into one
ensemble (`launch.pack=auto`: one process, on Slurm one array element) against one launch per
trial (`launch.pack=off`: each trial its own ranks, on Slurm its own array element).

The same `toolkit launch -m` command runs both ways, A B A B over --repeats rounds, from
command start to exit (composition, run dirs, rank start-up, training, summaries); medians
and their ratio. The model is a user's TCN (tests/fixtures/userpkg/sweep_models.py: causal
dilated convolutions over [time, series] windows) on a user's dataset of generated windows
(userpkg.datasets.NoisySeries), one rank per trial, as a researcher's sweep runs. Prints one
JSON object (and writes it to --json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolkit.executors import repo_root

FIXTURES = repo_root() / "tests" / "fixtures"  # the user's package (outside the toolkit)
SERIES, TARGETS, WINDOW = 8, 4, 32
SWEEP = [
    "model._target_=userpkg.sweep_models.TinyTCN",
    f"model.num_series={SERIES}",
    f"model.num_targets={TARGETS}",
    "model.channels=16",
    "model.num_layers=3",
    "model.dropout=0.0",
    "data=dataset",
    "data._target_=userpkg.datasets.NoisySeries",
    "+data.length=4096",
    f"+data.window={WINDOW}",
    f"+data.num_series={SERIES}",
    f"+data.num_targets={TARGETS}",
    f"+data.seq_len={WINDOW}",
    "+data.num_workers=0",
    "trainer.global_batch_size=32",
    "trainer.eval_batches=1",
    "trainer.log_every=10",
    "trainer.progress=false",
    "cluster.tasks_per_node=1",
]
VARIANTS = ("off", "auto")  # launch.pack: one launch per trial, then packed


def sweep_command(lrs: list[str], seeds: list[str], steps: int, slurm: bool) -> list[str]:
    cmd = [*SWEEP, f"trainer.steps={steps}", f"optim.lr={','.join(lrs)}"]
    cmd.append(f"seed={','.join(seeds)}")
    return [*cmd, "cluster=slurm"] if slurm else cmd


def run_sweep(overrides: list[str], pack: str, sweep_dir: Path, timeout_s: float) -> float:
    """Seconds from start to exit of `toolkit launch -m ... launch.pack=PACK`; raises with the
    output's tail when the sweep fails."""
    paths = [str(repo_root()), str(FIXTURES), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    cmd = [sys.executable, "-m", "toolkit.launch", "-m", *overrides, f"launch.pack={pack}"]
    cmd.append(f"hydra.sweep.dir={sweep_dir}")
    start = time.perf_counter()
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=repo_root()
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"launch.pack={pack} sweep failed (exit {done.returncode}):\n{tail}")
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.sweep_pack")
    parser.add_argument("--lrs", default="0.0005,0.001,0.002,0.004")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--slurm", action="store_true", help="cluster=slurm (the dev cluster)")
    parser.add_argument("--dir", type=Path, default=None, help="where the sweeps' run dirs go")
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    lrs, seeds = args.lrs.split(","), args.seeds.split(",")
    overrides = sweep_command(lrs, seeds, args.steps, args.slurm)
    root = Path(tempfile.mkdtemp(prefix="bench-sweep-pack-", dir=args.dir))
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for pack in VARIANTS:  # A B A B: the machine's drift falls on both
            wall = run_sweep(overrides, pack, root / f"{r}-{pack}", args.timeout_s)
            walls[pack].append(wall)
            print(f"round {r}: launch.pack={pack}: {wall:.1f} s", file=sys.stderr, flush=True)
    median = {v: statistics.median(w) for v, w in walls.items()}
    out = {
        "trials": len(lrs) * len(seeds),
        "steps": args.steps,
        "cluster": "slurm" if args.slurm else "local",
        "overrides": overrides,
        "wall_s": walls,
        "median_wall_s": median,
        "packed_speedup": median["off"] / median["auto"],
        "cpus": os.cpu_count(),
        "run_dirs": str(root),
    }
    from toolkit.measure.results import print_json

    print_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
