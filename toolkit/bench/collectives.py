"""Collective-communication benchmark, nccl-tests style: `task=bench_collectives`.

    python -m toolkit.bench.collectives [OVERRIDE ...]
        == python -m toolkit.launch task=bench_collectives [OVERRIDE ...]

For every op in collectives.ops and every size of the sweep: warm-up calls (the first one on
patterned inputs, checked), then `iters` timed calls back to back, one device sync at the end;
time per call averaged over ranks (collectives.time_reduce). Rank 0 prints the table and
writes RUN_DIR/collectives.h5 and RUN_DIR/collectives.txt. Wrong results (exit 3) and an
average busbw below collectives.expected_busbw_gbps (exit 4) fail the run, after the report.
The measurement is toolkit.collectives; the task that runs it, toolkit.tasks.bench_collectives.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.bench.collectives OVERRIDES`: the launcher with task=bench_collectives."""
    from toolkit.launch import main as launch

    args = sys.argv[1:] if argv is None else argv
    return launch([*args, "task=bench_collectives"])


if __name__ == "__main__":
    sys.exit(main())
