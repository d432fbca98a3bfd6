"""A rank's exit (toolkit.entrypoint.exit_without_teardown): what the interpreter's exit
would do before tearing down its modules still happens (threads that are not daemons end
their work, ThreadPoolExecutor's workers are released, atexit handlers run, buffered output
is written), and the exit status is the rank's."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROGRAM = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from toolkit.entrypoint import exit_without_teardown

out = Path(sys.argv[1])
pool = ThreadPoolExecutor(2)  # idle non-daemon workers, as torch.compile leaves them
pool.submit(time.sleep, 0.01).result()
def late_work():
    time.sleep(0.5)
    (out / "thread").write_text("done")
threading.Thread(target=late_work).start()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("buffered, no newline")
exit_without_teardown(3)
"""


def test_a_rank_exits_with_its_status_after_its_threads_and_atexit_handlers(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,  # a join of the pool's idle workers without releasing them never ends
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, no newline"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"
