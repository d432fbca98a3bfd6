"""`make test`: the whole suite, with the dev-cluster tests overlapping the others.

The tests marked `slurm` spend most of their time waiting on the scheduler, on requeues and
on stalls they inject (41-70 % of the two cores idle while they ran, docs/BENCHMARKS.md,
"Issue 37 — the suite's time on 2026-12-04"). So they run in a second pytest process,
started first, while this one runs, in turn:

1. the quick tests (neither `slurm` nor `slow`: unit tests of a few seconds at most, which
   time nothing);
2. the slow tests marked `load_tolerant`: real launches that compare losses, files and
   layouts, and time nothing;
3. once the Slurm tests have ended, the other slow tests alone on the cores as before: among
   them the hang watchdog, straggler, stall and fail-fast tests, which time what they see.

Every test runs once; nothing is skipped that ran before. `make test ARGS="..."` (any pytest
argument) runs one plain pytest with those arguments instead. The last line is the whole
suite's count, `suite: N passed, N failed, N skipped`, from each stream's JUnit XML; the exit
status is non-zero when any stream failed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stream:
    name: str
    marks: str

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
        ]


SLURM = Stream("slurm", "slurm")
QUICK = Stream("quick", "not slurm and not slow")
TOLERANT = Stream("tolerant", "slow and load_tolerant and not slurm")
SLOW = Stream("slow", "slow and not load_tolerant and not slurm")
FOREGROUND_BESIDE_SLURM = (QUICK, TOLERANT)


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


def main(argv: list[str]) -> int:
    if argv:  # the edit loop's way: one plain pytest with the given arguments
        return subprocess.call([sys.executable, "-m", "pytest", *argv], cwd=REPO)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="suite-") as name:
        tmp = Path(name)
        log = tmp / "slurm.log"
        with open(log, "wb") as out:
            background = subprocess.Popen(
                SLURM.command(tmp), cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )
            print(f"== {SLURM.name} tests (-m {SLURM.marks!r}) started alongside", flush=True)
            codes = {}
            for stream in FOREGROUND_BESIDE_SLURM:
                print(f"== {stream.name} tests (-m {stream.marks!r})", flush=True)
                codes[stream.name] = subprocess.call(stream.command(tmp), cwd=REPO)
            codes[SLURM.name] = background.wait()
        print(f"== {SLURM.name} tests (-m {SLURM.marks!r}), their output:", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        print(f"== {SLOW.name} tests (-m {SLOW.marks!r})", flush=True)
        codes[SLOW.name] = subprocess.call(SLOW.command(tmp), cwd=REPO)
        total = Counts()
        for stream in (*FOREGROUND_BESIDE_SLURM, SLURM, SLOW):
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
