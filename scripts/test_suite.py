"""`make test`: the whole suite, with the dev-cluster tests overlapping the others.

The tests marked `slurm` spend most of their time waiting on the scheduler, on requeues and
on stalls they inject (41-70 % of the two cores idle while they ran, docs/BENCHMARKS.md,
"Issue 37 — the suite's time on 2026-12-04"), and the local tests left the cores ~30 % idle
beside them when each stream was one pytest process ("Issue 37 — forked CPU ranks"). So two
pytest processes start together:

1. the `slurm` tests;
2. every test that times nothing, in two pytest-xdist workers that take tests from one
   queue: the quick tests (neither `slurm` nor `slow`) and the slow tests marked
   `load_tolerant` (real launches that compare losses, files, layouts and exit statuses,
   and wait on events, never on the clock). A worker that has finished its share takes
   another's, so a long launch never leaves a core idle behind it.

Once the `slurm` tests have ended, the background goes on with the slow tests marked
`waits` (the hang watchdog's, the node agent's restarts: they mostly sleep through their own
hang windows, the cores ~60 % idle when they ran alone), two at a time, beside the queue.
Once everything has ended, the other slow tests run alone, one at a time: the
straggler, stall, profiling, fail-fast and benchmark tests, which measure (a straggler test
failed with pytest-xdist workers beside it: docs/BENCHMARKS.md, "Issue 37 — the suite's
time, and where it goes"), and with them the quick tests marked `timing`, which measure
shares of the cores (the checkpoint stager's GIL test failed in the queue on 2026-12-05).

Every test runs once; nothing is skipped that ran before. `make test ARGS="..."` (any pytest
argument) runs one plain pytest with those arguments instead. The last line is the whole
suite's count, `suite: N passed, N failed, N skipped`, from each stream's JUnit XML; the exit
status is non-zero when any stream failed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stream:
    name: str
    marks: str
    workers: int = 0  # pytest-xdist workers sharing one queue; 0: the tests run in order

    def command(self, tmp: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            self.marks,
            "-p",
            "no:cacheprovider",  # two sessions at once: neither writes .pytest_cache
            f"--basetemp={tmp / self.name}",
            f"--junitxml={tmp / (self.name + '.xml')}",
            "--durations=25",  # each stream's slowest tests, where the next cut is looked for
            *(["-n", str(self.workers), "--dist", "worksteal"] if self.workers else []),
        ]


SLURM = Stream("slurm", "slurm")
UNTIMED = Stream("untimed", "not slurm and not timing and (not slow or load_tolerant)", workers=2)
WAITS = Stream(
    "waits", "slow and waits and not load_tolerant and not slurm and not timing", workers=2
)
SLOW = Stream("slow", "not slurm and (timing or (slow and not waits and not load_tolerant))")
BACKGROUND = (SLURM, WAITS)  # one after the other, beside UNTIMED
STREAMS = (*BACKGROUND, UNTIMED, SLOW)  # SLOW: once the others have ended


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def add(self, other: Counts) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped


def counts(junit: Path) -> Counts:
    """Passed, failed (failures and errors) and skipped tests of one pytest's JUnit XML; a
    stream that wrote none counts as one failure."""
    if not junit.is_file():
        return Counts(failed=1)
    root = ET.parse(junit).getroot()  # noqa: S314 - pytest's own file, written just now
    total = Counts()
    for suite in root.iter("testsuite"):
        tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        total.add(Counts(tests - skipped - failed, failed, skipped))
    return total


def run_in_order(streams: tuple[Stream, ...], tmp: Path, codes: dict[str, int]) -> None:
    """Each stream's pytest after the one before, its output kept in tmp/<name>.log."""
    for stream in streams:
        with open(tmp / f"{stream.name}.log", "wb") as out:
            codes[stream.name] = subprocess.call(
                stream.command(tmp), cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )


def main(argv: list[str]) -> int:
    if argv:  # the edit loop's way: one plain pytest with the given arguments
        return subprocess.call([sys.executable, "-m", "pytest", *argv], cwd=REPO)
    started = time.monotonic()
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="suite-") as name:
        tmp = Path(name)
        background = threading.Thread(target=run_in_order, args=(BACKGROUND, tmp, codes))
        background.start()
        for stream in BACKGROUND:
            print(f"== {stream.name} tests (-m {stream.marks!r}) in the background", flush=True)
        print(f"== {UNTIMED.name} tests (-m {UNTIMED.marks!r})", flush=True)
        codes[UNTIMED.name] = subprocess.call(UNTIMED.command(tmp), cwd=REPO)
        background.join()
        for stream in BACKGROUND:
            print(f"== {stream.name} tests (-m {stream.marks!r}), their output:", flush=True)
            sys.stdout.write((tmp / f"{stream.name}.log").read_text(errors="replace"))
        print(f"== {SLOW.name} tests (-m {SLOW.marks!r})", flush=True)
        codes[SLOW.name] = subprocess.call(SLOW.command(tmp), cwd=REPO)
        total = Counts()
        for stream in STREAMS:
            total.add(counts(tmp / f"{stream.name}.xml"))
    minutes = (time.monotonic() - started) / 60
    failed_streams = [name for name, code in codes.items() if code != 0]
    print(
        f"== the whole suite took {minutes:.1f} min; streams failed: "
        f"{', '.join(failed_streams) or 'none'}"
    )
    print(f"suite: {total.passed} passed, {total.failed} failed, {total.skipped} skipped")
    return 1 if failed_streams else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
