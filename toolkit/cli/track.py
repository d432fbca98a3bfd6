"""`toolkit track sync RUN [--tracker mlflow|tensorboard|wandb]`: a run's metrics into its
trackers after the fact (toolkit.tracking.sync): what a tracker missed while its server was
down, or a whole run launched without it; a tracker run left running is ended."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.cli.rundir import is_run_dir

TRACKER_NAMES = ("tensorboard", "mlflow", "wandb")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolkit track", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="send a run's metrics to its trackers")
    sync.add_argument("run", type=Path, help="the run directory")
    sync.add_argument(
        "--tracker",
        choices=TRACKER_NAMES,
        action="append",
        help="this tracker (repeatable); default: the trackers the run used",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run_dir = args.run.resolve()
    if not is_run_dir(run_dir):
        print(f"error: {args.run}: not a run directory (no config.yaml and launch.yaml)",
              file=sys.stderr)  # fmt: skip
        return 2
    from toolkit.config.compose import load_job
    from toolkit.tracking.sync import sync_run

    names = args.tracker or load_job(run_dir / "config.yaml").tracking.backends
    if not names:
        print(
            f"error: {args.run} used no tracker: name one with --tracker "
            f"({'|'.join(TRACKER_NAMES)})",
            file=sys.stderr,
        )
        return 2
    failed = False
    for name in names:
        try:
            done = sync_run(run_dir, name)
        except Exception as exc:  # noqa: BLE001 - one line per tracker, the others still go
            text = str(exc).strip().splitlines()
            print(f"{name}: not synced: {type(exc).__name__}: {text[0] if text else ''}",
                  file=sys.stderr)  # fmt: skip
            failed = True
            continue
        where = done.where.get("url") or done.where.get("run_id") or done.where.get("logdir")
        ended = "; its run ended" if done.finished else ""
        print(f"{name}: sent {done.steps} step record(s), {done.events} event(s) to {where}{ended}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
