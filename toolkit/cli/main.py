"""`toolkit SUBCOMMAND ...`: one command over the toolkit's entry points.

Each subcommand hands its arguments unchanged to the module that `python -m ...` runs
(`toolkit launch ...` is `python -m toolkit.launch ...`), so both spell the same thing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# name -> (module with main(argv), what it does)
BENCHES = {
    "train": ("toolkit.measure.run", "step time, tokens/s, MFU, memory; predicted vs measured"),
    "ab": (
        "toolkit.bench.ab",
        "A/B of override lists: overhead, watchdog, lowbit, pipeline, telemetry, profiling, "
        "tracking, tradeoffs",
    ),
    "collectives": ("toolkit.bench.collectives", "nccl-tests-style collective sweep"),
    "compare-collectives": ("toolkit.bench.compare_collectives", "rank a sweep's NCCL settings"),
    "collectives-baseline": ("toolkit.bench.collectives_baseline", "the collective baseline"),
    "checkpoint": ("toolkit.bench.checkpoint.__main__", "checkpoint stall and time to resume"),
    "kernels": ("toolkit.bench.kernels", "fused kernels vs their reference: memory, time"),
    "data": ("toolkit.bench.data", "loader samples/s by format and workers vs the need"),
    "user-data": ("toolkit.bench.user_data", "the user-dataset loader vs a plain DataLoader"),
    "grad-sync": ("toolkit.bench.grad_sync", "gradient sync per micro-step: peak memory"),
    "streams": (
        "toolkit.bench.streams",
        "an IterableDataset split across ranks: every n-th item vs the dataset's own shard()",
    ),
    "ensemble": (
        "toolkit.bench.ensemble",
        "K members in one ensemble step vs K separate steps (K = 1, 8, 32)",
    ),
    "quant": (
        "toolkit.bench.quant",
        "LSTM/TCN/transformer training on order-book windows: one model vs an ensemble",
    ),
    "sweep-pack": (
        "toolkit.bench.sweep_pack",
        "a lr x seed sweep of a small TCN: packed into one ensemble vs one launch per trial",
    ),
    "script-launch": (
        "toolkit.bench.script_launch",
        "a user's script: launch-to-first-step vs torchrun (--slurm: srun), agent on vs off",
    ),
    "telemetry": ("toolkit.bench.telemetry", "telemetry size, agent costs, report speed"),
    "tracking": ("toolkit.bench.tracking", "experiment trackers: cost per record"),
    "recovery-scale": (
        "toolkit.fault.scale_sim",
        "recovery at 128/1,024/8,192 ranks on paper: rank 0, store, time by phase",
    ),
    "gpu": ("toolkit.measure.gpu", "GPU validation: matmul, bandwidth, NCCL"),
}

DEV_CLUSTER = Path(__file__).resolve().parents[2] / "scripts" / "dev-cluster"


def module_main(module: str) -> Callable[[list[str]], int]:
    return importlib.import_module(module).main


def run_launch(argv: list[str]) -> int:
    return module_main("toolkit.launch")(argv)


def run_telemetry(command: str) -> Callable[[list[str]], int]:
    return lambda argv: module_main("toolkit.telemetry.cli")([command, *argv])


def run_bench(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHES:
        lines = [f"  {name:<22}{what}" for name, (_, what) in BENCHES.items()]
        stream = sys.stdout if argv and argv[0] in ("-h", "--help") else sys.stderr
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: no benchmark '{argv[0]}'", file=stream)
        print("usage: toolkit bench NAME [ARGS ...]\n\nbenchmarks:", *lines, sep="\n", file=stream)
        return 0 if stream is sys.stdout else 2
    return module_main(BENCHES[argv[0]][0])(argv[1:])


def run_cluster(argv: list[str]) -> int:
    """`toolkit cluster up|down|status|env`: scripts/dev-cluster (a checkout's script)."""
    if not argv or argv[0] not in ("up", "down", "status", "env"):
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print(
            "usage: toolkit cluster up|down|status|env [--purge]",
            file=sys.stdout if asked else sys.stderr,
        )
        return 0 if asked else 2
    if not DEV_CLUSTER.is_file():
        print(
            f"error: {DEV_CLUSTER}: the dev cluster script comes with a checkout", file=sys.stderr
        )
        return 2
    return subprocess.call([str(DEV_CLUSTER), *argv], env=dict(os.environ))


def run_status(argv: list[str]) -> int:
    from toolkit.cli.status import status

    parser = argparse.ArgumentParser(prog="toolkit status", description=COMMANDS["status"][1])
    parser.add_argument("target", nargs="?", default=".", help="a run directory or a Slurm job id")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    return status(args.target, args.json)


def run_runs(argv: list[str]) -> int:
    from toolkit.cli.status import runs

    parser = argparse.ArgumentParser(prog="toolkit runs", description=COMMANDS["runs"][1])
    parser.add_argument("root", nargs="?", default="outputs", help="where to look (outputs)")
    parser.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    args = parser.parse_args(argv)
    return runs(args.root, args.json)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "launch": (run_launch, "compose, validate and run a job (python -m toolkit.launch)"),
    "status": (run_status, "where a run is: state, step, loss, tokens/s, checkpoint, files"),
    "runs": (run_runs, "every run under a directory, with its state and overrides"),
    "report": (run_telemetry("report"), "telemetry report of a run (tables, plots, HTML)"),
    "watch": (run_telemetry("watch"), "live view of a running job's telemetry"),
    "compare": (run_telemetry("compare"), "two runs side by side, with run-to-run noise"),
    "bench": (run_bench, "benchmarks: toolkit bench NAME (toolkit bench --help lists them)"),
    "perfmodel": (
        lambda argv: module_main("toolkit.perfmodel.__main__")(argv),
        "predict step time, memory and MFU of a configuration",
    ),
    "export": (
        lambda argv: module_main("toolkit.cli.export")(argv),
        "a checkpoint's model as one file",
    ),
    "cluster": (run_cluster, "the local dev Slurm cluster: up|down|status|env"),
    "track": (
        lambda argv: module_main("toolkit.cli.track")(argv),
        "trackers after the fact: track sync RUN sends a run's metrics to its trackers",
    ),
}


def usage() -> str:
    lines = [f"  {name:<11}{what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(
        [
            "usage: toolkit COMMAND [ARGS ...]   (toolkit COMMAND --help for its own)",
            "",
            "commands:",
            *lines,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-sc"], ["--shell-completion"]):  # the bash completion calls back here
        return run_launch(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: no command '{command}'\n{usage()}", file=sys.stderr)
        return 2
    return COMMANDS[command][0](rest)


if __name__ == "__main__":
    sys.exit(main())
