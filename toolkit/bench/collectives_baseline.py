"""The collective benchmark checked against a hand-written loop (toolkit.collectives.baseline):

    python -m toolkit.bench.collectives_baseline [OVERRIDE ...]
        == python -m toolkit.bench.collectives collectives.compare_baseline=true [OVERRIDE ...]

runs both in the same job, interleaved size by size (collectives.baseline_repeats times each,
alternating which goes first), and adds "base time", "base busbw" and their ratio to the table.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from toolkit.bench.collectives import main as bench

    args = sys.argv[1:] if argv is None else argv
    return bench([*args, "collectives.compare_baseline=true"])


if __name__ == "__main__":
    sys.exit(main())
