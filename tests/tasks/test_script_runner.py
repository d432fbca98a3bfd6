"""The child that runs a user's script on a rank (toolkit.tasks.script_runner): once the
script returns, what it left of torch.distributed is released while the interpreter is
still whole, not during its shutdown where gloo's threads can abort a finished run."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "leaves_group.py"


def test_a_process_group_the_script_left_is_destroyed_before_the_interpreter_exits(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "toolkit.tasks.script_runner", str(tmp_path), "--path", str(SCRIPT)]
        + ["--", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "at exit: process group initialised=False" in r.stdout
