"""`python -m toolkit.bench.checkpoint <stall|resume> [OPTIONS]`: runs one
benchmark of this package, prints its result and with `--json` also writes it there."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from toolkit.bench.checkpoint import resume, stall

BENCHMARKS = {"stall": stall, "resume": resume}
PRINTS_RESULT = ("stall",)  # resume prints a line per measurement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.checkpoint")
    sub = parser.add_subparsers(dest="what", required=True)
    for name, bench in BENCHMARKS.items():
        p = sub.add_parser(name)
        bench.add_arguments(p)
        p.add_argument(
            "--dir", default=None, help="where checkpoints are written (default: $TMPDIR)"
        )
        p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if getattr(args, "baselines_every", 1) < 1:
        parser.error(f"--baselines-every {args.baselines_every}: must be >= 1 (1: every trial)")
    result: Any = BENCHMARKS[args.what].run(args)
    text = json.dumps(result, indent=1)
    print(text if args.what in PRINTS_RESULT else "")
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
