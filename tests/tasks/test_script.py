"""Your own script under `toolkit launch script=...`: an unmodified torchrun-style DDP script
on 2 local ranks, the toolkit.session records in the report, a failing rank and a hung rank
stopping the job, and bad input refused in one line. The scripts live in
tests/fixtures/scripts/, as a user's would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, launch
from toolkit.cli.rundir import read_run
from toolkit.errors import EXIT_HANG
from toolkit.executors import rundir_lock
from toolkit.launch import main as launch_main
from toolkit.tasks.script import note_restart

SCRIPTS = REPO / "tests" / "fixtures" / "scripts"
DDP = str(SCRIPTS / "ddp_train.py")
SESSION = str(SCRIPTS / "session_train.py")


def run_script(tmp_path: Path, script: str, args: str, *more: str, timeout: float = 120):
    return launch(
        f"script.path={script}",
        f"script.args={args}",
        "cluster.tasks_per_node=2",
        f"hydra.run.dir={tmp_path / 'run'}",
        *more,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_unmodified_ddp_script_runs_on_two_ranks_with_quoted_args(tmp_path):
    r = run_script(tmp_path, DDP, "[--steps,3,--tag,'a b \"q\" $HOME']")
    assert r.returncode == 0, r.stderr[-2000:]
    # The argument arrives as one word, quotes, spaces and dollar sign untouched.
    assert "step 3 loss" in r.stdout and 'a b "q" $HOME' in r.stdout
    run = tmp_path / "run"
    assert (run / "logs" / "rank1.log").is_file()  # per-rank logs
    assert list((run / "telemetry").glob("node-*-attempt0.h5"))  # the node agent ran
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert "final_loss" not in summary  # a script that logs nothing has no loss, not 0.0
    # Rank 0, followed by the launcher, keeps its output in the run dir as well.
    assert "step 3 loss" in (run / "logs" / "rank0.out").read_text()
    # A clean exit leaves no empty stack file behind (docs/fault.md).
    assert not [p for p in (run / "hangs").rglob("*") if p.is_file()]


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_the_records_a_script_logs_reach_its_experiment_tracker(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r = run_script(tmp_path, SESSION, "[--steps,4]", "tracking=tensorboard")
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "run"
    logged = [
        json.loads(line) for line in (run / "metrics" / "rank0.jsonl").read_text().splitlines()
    ]
    logdir = json.loads((run / "tracking" / "trackers.json").read_text())["tensorboard"]["logdir"]
    scalars = {e.step: e.value for e in EventAccumulator(logdir).Reload().Scalars("train/loss")}
    assert scalars == pytest.approx({s["step"]: s["loss"] for s in logged}, rel=1e-6)


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_report_shows_the_logged_loss_and_the_node_telemetry(tmp_path):
    r = run_script(tmp_path, SESSION, "[--steps,4]")
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "run"
    logged = [
        json.loads(line) for line in (run / "metrics" / "rank0.jsonl").read_text().splitlines()
    ]
    assert [s["step"] for s in logged] == [1, 2, 3, 4]
    report = subprocess.run(
        [os.sys.executable, "-m", "toolkit.cli.main", "report", str(run)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    # The script is not the default model: nothing predicted for it.
    assert f"a script run (python {SESSION} --steps 4): no model prediction" in report.stdout
    # Nothing the script did not log is made up: no 0 % data wait, no "idle 100 %".
    assert "the step records carry no split of the step time" in report.stdout
    assert "Nodes" in report.stdout and "│    2 │" in report.stdout.replace("     2 │", "    2 │")
    csv = (run / "telemetry" / "report" / "steps.csv").read_text().splitlines()
    header = csv[0].split(",")
    first = dict(zip(header, csv[1].split(","), strict=True))
    # The loss the script logged, read back from the node's HDF5 file.
    assert float(first["loss"]) == pytest.approx(logged[0]["loss"], rel=1e-5)
    status = subprocess.run(
        [os.sys.executable, "-m", "toolkit.cli.main", "status", str(run)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert "completed" in status.stdout
    assert "step        4 / -" in status.stdout  # the script decides its total, not trainer.steps
    assert f"script      python {SESSION} --steps 4" in status.stdout  # the script, as itself
    shown = {
        name: subprocess.run(
            [os.sys.executable, "-m", "toolkit.cli.main", name, *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        for name, args in (("runs", ["--json", str(run.parent)]), ("watch", [str(run), "--once"]))
    }
    assert all(r.returncode == 0 for r in shown.values()), shown
    (listed,) = json.loads(shown["runs"].stdout)
    assert (listed["state"], listed["steps"], listed["total_steps"]) == ("completed", 4, None)
    for rank in (0, 1):  # watch's ranks table: each rank at the script's last logged step
        assert re.search(rf"│\s+{rank}\s+│\s+4\s+│", shown["watch"].stdout), shown["watch"].stdout
    # A Slurm requeue: the next attempt's rank-0 wrapper notes a restart, which status counts
    # (for a script that logs nothing too).
    note_restart(run, 1)
    assert read_run(run, ask_slurm=False).attempts == 2


@pytest.mark.slow
def test_a_failing_rank_stops_the_job_with_its_error(tmp_path):
    t0 = time.time()
    r = run_script(tmp_path, DDP, "[--steps,50,--sleep-s,0.2,--fail-rank,1,--fail-at,2]")
    assert r.returncode == 1
    assert "rank 1 failed with exit code 1" in r.stderr
    assert "injected failure on rank 1 at step 2" in r.stderr
    assert time.time() - t0 < 60  # not the 50 steps, nor gloo's timeout


def test_under_slurm_a_failure_before_any_signal_is_recorded_for_rank_0(tmp_path, monkeypatch):
    """srun answers a failed task by SIGTERMing the others; rank 0 reads this record so as not
    to take that for a preemption and requeue a job that will only fail again."""
    from toolkit.distributed.env import DistEnv
    from toolkit.tasks import script

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setattr(script, "SIGNAL_GRACE_S", 0.0)
    (tmp_path / "logs").mkdir()
    rank1 = DistEnv(1, 0, 2, 1, 1, 2, "n1", 29500, job_id="77", source="slurm")
    script.note_failure(tmp_path, rank1, 0, 143, received=[signal.SIGTERM])  # a preemption's
    assert script.failed_first(tmp_path, "77", 0) is None
    script.note_failure(tmp_path, rank1, 0, 1, received=[])
    assert script.failed_first(tmp_path, "77", 0) == {"rank": 1, "code": 1}
    assert script.failed_first(tmp_path, "77", 1) is None  # the next attempt starts clean
    assert script.failed_first(tmp_path, "78", 0) is None
    local = DistEnv(1, 1, 2, 2, 0, 1, "127.0.0.1", 29500, source="torchrun")
    script.note_failure(tmp_path / "elsewhere", local, 0, 1, received=[])  # locally: no record
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.slow
@pytest.mark.waits
def test_a_hung_rank_is_named_dumped_and_exits_79(tmp_path):
    r = run_script(
        tmp_path,
        DDP,
        "[--steps,50,--hang-rank,1,--hang-at,3]",
        "fault.hang_timeout_s=4",
        "fault.hang_startup_timeout_s=30",
    )
    assert r.returncode == EXIT_HANG, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    # Rank 0 waits in DDP's gradient all-reduce (its stacks: autograd's engine), rank 1 in
    # the script's own sleep: rank 1 alone is named, here and in summary.json.
    assert line.startswith("hang: rank 1 on node "), line
    assert "while ranks 0 wait in backward" in line, line
    (hang,) = (tmp_path / "run" / "hangs").glob("2*")
    summary = json.loads((hang / "summary.json").read_text())
    assert summary["stuck_ranks"] == [1] and summary["waiting_ranks"] == [0]
    # `toolkit status` and `runs` read the run as hung, with the hang's line, not running.
    run = read_run(tmp_path / "run", ask_slurm=False)
    assert (run.state, run.stop_reason, run.exit_code) == ("hung", summary["message"], 79)
    stacks = (hang / "stacks-rank1.txt").read_text()
    assert 'ddp_train.py", line' in stacks  # the script's own frame, where it blocks


@pytest.mark.slow
@pytest.mark.waits
def test_a_rank_that_exits_0_while_another_hangs_is_a_hang_naming_the_hung_rank(tmp_path):
    """Rank 1 leaves at once with exit 0; rank 0 blocks forever. Not a success: the watchdog
    names rank 0 alone (rank 1 ended: no stacks to take) and the launch exits 79."""
    t0 = time.time()
    r = run_script(
        tmp_path,
        DDP,
        "[--exit-rank,1,--hang-rank,0,--hang-at,0]",
        "fault.hang_timeout_s=6",
        "fault.hang_startup_timeout_s=60",
    )
    assert r.returncode == EXIT_HANG, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("hang: rank 0 on node "), line
    assert "rank 1 leaves early" in (tmp_path / "run" / "logs" / "rank1.out").read_text()
    (hang,) = (tmp_path / "run" / "hangs").glob("2*")
    assert 'ddp_train.py", line' in (hang / "stacks-rank0.txt").read_text()
    assert not (hang / "stacks-rank1.txt").exists()
    assert time.time() - t0 < 90


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_module_that_never_joins_a_process_group_runs_alone_on_every_rank(tmp_path):
    """`script.module=` runs a module of your package as `python -m` would; a script that
    never initialises a process group is not an error: each rank runs its own copy (as under
    torchrun), the launch ends with its status and nothing is left running."""
    run = tmp_path / "run"
    fixtures = str(REPO / "tests" / "fixtures")
    r = launch(
        "script.module=userpkg.solo",
        "script.args=[--steps,2]",
        "cluster.tasks_per_node=2",
        f"hydra.run.dir={run}",
        env={"PYTHONPATH": os.pathsep.join([fixtures, str(REPO)])},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rank 0 of 2 alone: loss" in r.stdout
    assert "rank 1 of 2 alone: loss" in (run / "logs" / "rank1.out").read_text()
    assert json.loads((run / "summary.json").read_text())["exit_code"] == 0
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout
    assert left == "", f"processes of the run still running: {left}"
    rundir_lock.acquire(run)  # free: every rank (each holds it) has ended
    rundir_lock.release(run)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["script.path=no/such/train.py"], "script.path=no/such/train.py: no such file"),
        (["script.module=json"], "script.module=json: a package without __main__.py"),
        (["script.module=no_such_pkg.train"], "script.module=no_such_pkg.train: "),
        ([f"script.path={DDP}", "script.args=['a\tb']"], "contains control character"),
        ([f"script.path={DDP}", "task=bench_train"], "task=bench_train: runs the toolkit's"),
    ],
)
def test_bad_script_input_is_one_line_and_exit_2(overrides, said, capsys):
    assert launch_main([*overrides, "launch.dry_run=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_dry_run_says_what_every_rank_would_run(capsys):
    assert (
        launch_main([f"script.path={DDP}", "script.args=[--steps,2]", "launch.dry_run=true"]) == 0
    )
    assert "ddp_train.py --steps 2" in capsys.readouterr().out


def test_a_sweep_of_a_script_on_slurm_is_one_job_array(capsys, tmp_path):
    argv = [
        "-m",
        f"script.path={DDP}",
        "script.args=[--lr,0.1],[--lr,0.2]",
        "cluster=slurm",
        "launch.dry_run=true",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    assert launch_main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("#SBATCH --array=0-1") == 1  # one array of two elements
    assert "-m toolkit.entrypoint" in out and '"$SLURM_ARRAY_TASK_ID"' in out
    assert not (tmp_path / "sweep").exists()  # a dry run writes and submits nothing


def test_session_is_a_no_op_outside_a_toolkit_launch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TOOLKIT_SESSION", "RANK")}
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run(
        [os.sys.executable, SESSION, "--steps", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "metrics").exists()


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_preemption_signal_saves_and_the_relaunch_resumes(tmp_path):
    """Locally: USR2 to every rank -> the script saves at a step boundary and the launch exits
    75; the same run dir again resumes from the checkpoint, with the losses of an
    uninterrupted run."""
    args = "[--steps,12,--sleep-s,0.3]"
    straight = run_script(tmp_path / "a", SESSION, args)
    assert straight.returncode == 0, straight.stderr[-2000:]
    cmd = ["script.path=" + SESSION, "script.args=" + args, "cluster.tasks_per_node=2"]
    run = tmp_path / "b" / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [os.sys.executable, "-m", "toolkit.launch", *cmd, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    steps = run / "metrics" / "rank0.jsonl"
    while not (steps.is_file() and len(steps.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    for child in wrapper_pids(proc.pid):
        os.kill(child, signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err[-2000:]
    again = launch(*cmd, f"hydra.run.dir={run}", timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    got = [json.loads(x)["loss"] for x in steps.read_text().splitlines()]
    want = [
        json.loads(x)["loss"]
        for x in (tmp_path / "a/run/metrics/rank0.jsonl").read_text().splitlines()
    ]
    assert got == want


def wrapper_pids(launcher: int) -> list[int]:
    """The rank wrappers: the launcher's children, or the children of its rank server when
    it forks them (launch.rank_start)."""
    ranks = []
    for pid in children(launcher):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"toolkit.rank_server" in cmdline:
            ranks += children(pid)
        elif b"toolkit.entrypoint" in cmdline:
            ranks.append(pid)
    return ranks


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]
