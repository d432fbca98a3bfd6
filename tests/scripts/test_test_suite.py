"""`make test`'s runner (scripts/test_suite.py): the streams cover every test once, and
the closing line counts what each stream's pytest wrote in its JUnit XML."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("suite_runner", REPO / "scripts" / "test_suite.py")
suite = importlib.util.module_from_spec(spec)
sys.modules["suite_runner"] = suite  # its dataclasses look their module up
spec.loader.exec_module(suite)


def test_the_streams_split_the_markers_so_that_every_test_runs_exactly_once():
    streams = suite.STREAMS
    for slurm, slow, tolerant, waits, timing in itertools.product((False, True), repeat=5):
        marks = {
            "slurm": slurm,
            "slow": slow,
            "load_tolerant": tolerant,
            "waits": waits,
            "timing": timing,
        }
        chosen = [s.name for s in streams if eval(s.marks, {}, marks)]  # noqa: S307 - ours
        assert len(chosen) == 1, (marks, chosen)


def test_the_closing_line_counts_a_real_pytest_runs_junit_xml(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert False\n"
        "@pytest.mark.skip(reason='shown')\n"
        "def test_skipped(): pass\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError\n"
        "def test_errors(broken): pass\n"
    )
    junit = tmp_path / "out.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
         "--rootdir", str(tmp_path), str(tmp_path / "test_three.py")],
        cwd=tmp_path, capture_output=True, timeout=120,
    )  # fmt: skip
    assert suite.counts(junit) == suite.Counts(passed=1, failed=2, skipped=1)
    assert suite.counts(tmp_path / "missing.xml") == suite.Counts(failed=1)
