"""Nothing of a job outlives it (toolkit.descendants): what a script leaves running ends
with its rank, and a launcher killed with SIGKILL takes its whole run with it, the run dir's
lock included, even when the script ignores SIGTERM. The script lives in
tests/fixtures/scripts/, as a user's would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, launch
from toolkit import descendants
from toolkit.executors import rundir_lock

pytestmark = [pytest.mark.slow, pytest.mark.load_tolerant]

LEAVES = str(REPO / "tests" / "fixtures" / "scripts" / "leaves_processes.py")


def still_running(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := [p for p in pids if descendants.alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def run_alone(script: str, args: str, run: Path, *more: str):
    """`script` with `args` on one local rank without telemetry, into run dir `run`."""
    return launch(
        f"script.path={script}",
        f"script.args={args}",
        "cluster.tasks_per_node=1",
        "telemetry=off",
        f"hydra.run.dir={run}",
        *more,
        timeout=120,
    )


def test_a_scripts_forked_child_and_setsid_daemon_end_with_the_job(tmp_path):
    """Both ignore SIGTERM; the daemon left the script's session, so a kill of the process
    group would miss it. The rank adopted both (a child subreaper) and ended them."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    r = run_alone(LEAVES, f"[{pids}]", run, "launch.kill_grace_s=0.5")
    assert r.returncode == 0, r.stderr[-2000:]
    child, daemon, _script = map(int, pids.read_text().split())
    assert still_running([child, daemon], within_s=0) == []


@pytest.mark.parametrize("rank_start", ["fork", "exec"])
def test_a_sigkilled_launcher_takes_the_whole_run_with_it(tmp_path, rank_start):
    """The script ignores SIGTERM and sleeps on, beside its child and daemon. Killing the
    launcher with SIGKILL: within launch.kill_grace_s and a few seconds the rank server
    (ranks forked from it) or the rank started in its own interpreter, the rank (which runs
    the script), what the script started and the node agent have ended, and the
    run dir's lock is free for a relaunch."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "toolkit.launch", f"script.path={LEAVES}"]
        + [f"script.args=[{pids},--stay]", "cluster.tasks_per_node=1", "launch.kill_grace_s=1"]
        + [f"launch.rank_start={rank_start}", f"hydra.run.dir={run}"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 90
    while not pids.exists():
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    run_pids = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
    names = " ".join(" ".join(psutil.Process(p).cmdline()) for p in run_pids)
    assert "toolkit.telemetry.agent" in names, names
    assert ("toolkit.rank_server" in names) == (rank_start == "fork"), names
    started = [int(p) for p in pids.read_text().split()]
    assert started[-1] in run_pids  # the script runs in its rank's own process
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert still_running(sorted({*run_pids, *started}), within_s=15) == []
    rundir_lock.acquire(run)  # a relaunch would not be refused
    rundir_lock.release(run)


def test_what_is_below_a_process_is_found_through_a_setsid_and_ended(tmp_path):
    """toolkit.descendants alone: a subreaper of its own adopts the daemon that left its
    session; `end` finds it by walking /proc and SIGKILLs it after the grace period."""
    program = (
        "import sys, time, runpy\n"
        "from toolkit import descendants\n"
        "descendants.become_subreaper()\n"
        f"sys.argv = ['x', {str(tmp_path / 'pids')!r}]\n"
        f"runpy.run_path({LEAVES!r})\n"
        "found = descendants.below()\n"
        "t0 = time.monotonic()\n"
        "ended = descendants.end(0.3)\n"
        "print(len(found), sorted(found) == ended, descendants.below(), time.monotonic() - t0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found, same, left, took_s = done.stdout.split("\n")[-2].split(" ", 3)
    assert (found, same, left) == ("2", "True", "[]")
    assert 0.3 <= float(took_s) < 5
    child, daemon, _ = map(int, (tmp_path / "pids").read_text().split())
    assert still_running([child, daemon], within_s=0) == []


def test_a_rank_log_is_capped_and_rotated_keeping_the_newest_output(tmp_path):
    """A script prints 5 MB against launch.max_log_bytes of 1 MiB: its rank's log and the
    one rotated file hold about 2 MiB, the newest lines among them."""
    run = tmp_path / "run"
    script = str(REPO / "tests" / "fixtures" / "scripts" / "prints_much.py")
    r = run_alone(script, "[5]", run, "launch.follow=false", "launch.max_log_bytes=1048576")
    assert r.returncode == 0, r.stderr[-2000:]
    out, rotated = run / "logs" / "rank0.out", run / "logs" / "rank0.out.1"
    assert out.read_text().endswith("the end\n")
    assert out.stat().st_size <= 1048576 + 65536 and rotated.stat().st_size <= 1048576 + 65536
    assert sorted(p.name for p in (run / "logs").glob("rank0.out*")) == ["rank0.out", "rank0.out.1"]
    first = rotated.read_text().splitlines()[0]
    assert int(first[:8]) > 2048  # the oldest megabytes were dropped


@pytest.mark.slurm
def test_on_the_dev_slurm_cluster_a_scripts_setsid_daemon_ends_with_its_step(
    slurm_cluster, tmp_path
):
    """The dev cluster tracks processes by their parent links (proctrack/linuxproc), which a
    daemon re-parented to init escapes; under the rank's subreaper it stays below the rank,
    which ends it with the step. (proctrack/cgroup would end it through the step's cgroup.)"""
    pids = tmp_path / "pids"
    done = subprocess.run(
        ["sbatch", "--wait", "-N1", "--ntasks-per-node=1", "--time=00:05:00",
         f"--output={tmp_path}/slurm-%j.out", "jobs/script.sbatch", f"script.path={LEAVES}",
         f"script.args=[{pids}]", "launch.kill_grace_s=0.5", "telemetry=off",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=dict(slurm_cluster.env, PYTHONPATH=str(REPO), TOOLKIT_PYTHON=sys.executable),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert done.returncode == 0, done.stdout + done.stderr + logs[-3000:]
    child, daemon, _script = map(int, pids.read_text().split())
    assert still_running([child, daemon], within_s=0) == []
