"""When several ranks are found dead at the same poll, the local launcher names the one that
failed first: the others mostly died of the broken collective it left behind."""

from __future__ import annotations

import subprocess
import sys

from toolkit.executors.local import LocalExecutor

# A rank that writes its error at a given delay after the start and exits 1, like the
# entrypoint and the script runner do (RUN_DIR/logs/error-rank<k>.txt).
RANK = """
import pathlib, sys, time
logs, rank, delay = pathlib.Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
time.sleep(delay)
(logs / f"error-rank{rank}.txt").write_text(f"rank {rank}: error\\n")
sys.exit(1)
"""


def ranks(logs, delays: list[float]) -> list[subprocess.Popen]:
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK, str(logs), str(rank), str(delay)])
        for rank, delay in enumerate(delays)
    ]
    for p in procs:
        p.wait()  # both dead before the launcher's first look
    return procs


def test_the_rank_that_wrote_its_error_first_is_named_not_rank_0(tmp_path):
    procs = ranks(tmp_path, [0.4, 0.0])  # rank 1 fails, rank 0 follows 0.4 s later
    code, failed = LocalExecutor()._supervise(procs, 1.0, tmp_path)
    assert (code, failed) == (1, 1)


def test_a_rank_killed_without_a_word_counts_as_the_first(tmp_path):
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    killed.kill()
    killed.wait()
    (follower,) = ranks(tmp_path, [0.0])
    code, failed = LocalExecutor()._supervise([follower, killed], 1.0, tmp_path)
    assert (code, failed) == (137, 1)
