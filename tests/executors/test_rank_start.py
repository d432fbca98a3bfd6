"""How local ranks start (launch.rank_start): `exec`, a fresh interpreter per rank, or `fork`,
forked from one server that imported torch once; `auto` forks where no GPU is in sight.
A forked rank trains and logs as an exec'd one does; a fork with a GPU here is refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO, launch, losses
from toolkit.errors import EXIT_PREEMPTED, UserError
from toolkit.executors.rank_start import use_fork

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def test_auto_forks_cpu_ranks_and_execs_gpu_ranks():
    assert use_fork("auto", gpus_here=0)
    assert not use_fork("auto", gpus_here=8)
    assert not use_fork("exec", gpus_here=0)
    assert use_fork("fork", gpus_here=0)


def test_fork_with_a_gpu_here_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"launch.rank_start=fork: .* use launch.rank_start=exec"):
        use_fork("fork", gpus_here=2)


def test_an_unknown_way_to_start_ranks_is_a_one_line_config_error(tmp_path):
    done = launch("launch.rank_start=spawn", "launch.dry_run=true", timeout=60)
    assert done.returncode != 0
    assert "launch.rank_start=spawn: must be one of auto, exec, fork" in done.stderr


@pytest.mark.slow
def test_forked_ranks_train_log_and_end_as_exec_ranks_do(tmp_path, tiny):
    runs = {}
    for how in ("exec", "fork"):
        run = tmp_path / how
        done = launch(*tiny, f"launch.rank_start={how}", f"hydra.run.dir={run}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "step 8/8" in done.stderr  # rank 0 on the launcher's own stream
        assert "WARNING" not in (run / "logs" / "rank1.err").read_text()
        runs[how] = run
    assert losses(runs["fork"]) == losses(runs["exec"])  # bitwise
    assert losses(runs["fork"], rank=1) == losses(runs["exec"], rank=1)
    assert (runs["fork"] / "logs" / "rank_server.log").is_file()
    assert not (runs["exec"] / "logs" / "rank_server.log").exists()


@pytest.mark.slow
def test_a_killed_rank_server_stops_its_ranks_and_the_launcher_still_hears_them(tmp_path, tiny):
    """The ranks take the server's death as their launcher's (SIGTERM: stop at the next step);
    the launcher, which adopts them, reaps them and ends with a failure instead of waiting on.
    (Which rank it names, and whether with 75 or with SIGTERM's 143, depends on which rank
    ends first: the same as when a launcher's ranks are signalled one by one.)"""
    run = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "toolkit.launch", *tiny, "trainer.steps=400"]
        + ["fault.data_delay_s=0.2", "launch.rank_start=fork", f"hydra.run.dir={run}"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    steps = run / "metrics" / "rank0.jsonl"
    deadline = time.monotonic() + 120
    while not (steps.is_file() and steps.read_text().strip()):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.1)
    (server,) = [
        p
        for p in psutil.Process(launcher.pid).children()
        if "toolkit.rank_server" in " ".join(p.cmdline())
    ]
    ranks = server.children()
    assert len(ranks) == 2
    server.kill()
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode in (EXIT_PREEMPTED, 128 + signal.SIGTERM), err[-2000:]
    assert re.search(r"rank [01] failed with exit code (75|143); the job was stopped", err)
    assert not [r for r in ranks if r.is_running() and r.status() != psutil.STATUS_ZOMBIE]
