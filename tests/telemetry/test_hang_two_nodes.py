"""Two node agents' watchdogs meeting in one run dir, as on two nodes: real rank processes
(their heartbeats and stack-dump signal installed as in a job), the watchdogs of "nA" and
"nB" polling side by side. Whichever sees the hang first claims it, the other joins; the
summary holds both nodes' ranks and names the rank on nB that never entered the collective
the rank on nA waits in; both ranks' stacks are dumped; both ranks are ended."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from toolkit.config.telemetry import TelemetryConfig
from toolkit.executors.after_hang import after_hang
from toolkit.executors.requeue import RequeuePolicy
from toolkit.fault.hang import read_hang_summary
from toolkit.telemetry.heartbeat import heartbeat_path
from toolkit.telemetry.spec import AgentSpec, WatchdogSpec
from toolkit.telemetry.watchdog import Watchdog

REPO = Path(__file__).resolve().parents[2]

RANK = """
import sys, time
from pathlib import Path
from toolkit.fault.hang import install_stack_dump
from toolkit.telemetry.heartbeat import Heartbeat
run_dir, rank, hb, entered, blocked = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
install_stack_dump(Path(run_dir), rank)
beat = Heartbeat(Path(hb))
beat.beat("step", 3)
for i in range(entered):
    beat.enter("all_reduce")
    if i < entered - 1 or not blocked:
        beat.leave()
print("ready", flush=True)
def blocked_here():
    while True:
        time.sleep(1)
blocked_here()
"""


def start_rank(run_dir: Path, rank: int, socket: str, entered: int, blocked: bool):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RANK,
            str(run_dir),
            str(rank),
            str(heartbeat_path(socket, rank)),
            str(entered),
            "1" if blocked else "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def watchdog(run_dir: Path, node: str, rank: int, socket: str, pid: int) -> Watchdog:
    spec = AgentSpec(
        run_dir=str(run_dir),
        node=node,
        attempt=0,
        job_id="j1",
        node_rank=rank,
        ranks=[rank],
        world_size=2,
        num_nodes=2,
        socket=socket,
        parent_pid=pid,  # the agent's parent is its node's first rank
        config=TelemetryConfig(),
    )
    return Watchdog(spec, WatchdogSpec(timeout_s=1.0, startup_timeout_s=60.0))


def test_two_nodes_agree_on_one_hang_and_name_the_rank_on_the_other_node(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sockets = {n: str(tmp_path / f"{n}.sock") for n in ("nA", "nB")}
    # rank 0 (nA) waits in all_reduce #5; rank 1 (nB) left #4 and never entered #5
    ranks = [
        start_rank(run_dir, 0, sockets["nA"], entered=5, blocked=True),
        start_rank(run_dir, 1, sockets["nB"], entered=4, blocked=False),
    ]
    dogs = [
        watchdog(run_dir, "nA", 0, sockets["nA"], ranks[0].pid),
        watchdog(run_dir, "nB", 1, sockets["nB"], ranks[1].pid),
    ]
    stops: dict[str, str] = {}

    def run(dog: Watchdog) -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            stop = dog.poll(time.time())
            if stop is not None:
                stops[dog.host] = stop
                return
            time.sleep(0.05)

    threads = [threading.Thread(target=run, args=(d,)) for d in dogs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert sorted(stops) == ["nA", "nB"], stops
        for proc in ranks:
            assert proc.wait(10) == -9  # ended by its node's agent
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    hangs = [p for p in (run_dir / "hangs").iterdir() if not p.name.startswith(".")]
    assert len(hangs) == 1, hangs  # one hang, not one per node
    hang = hangs[0]
    leaders = [d for d in dogs if d.summary is not None]
    assert len(leaders) == 1
    summary = read_hang_summary(hang)
    assert summary["stuck_ranks"] == [1] and summary["stuck_hosts"] == ["nB"]
    assert summary["waiting_ranks"] == [0]
    assert summary["collective"] == {"op": "all_reduce", "seq": 5}
    assert sorted(summary["nodes_reporting"]) == ["nA", "nB"]
    assert summary["hosts_by_rank"] == {"0": "nA", "1": "nB"}
    assert summary["message"].startswith("hang: rank 1 on node nB stuck in all_reduce #5 for ")
    assert summary["action"] == "ended (not a Slurm job: nothing to requeue)"
    for rank in (0, 1):
        assert "in blocked_here" in (hang / f"stacks-rank{rank}.txt").read_text()
    assert not list((run_dir / "hangs" / ".stacks").iterdir())  # moved into the hang dir


def test_after_hang_requeues_only_a_slurm_job_with_restarts_left(tmp_path, monkeypatch) -> None:
    summary: dict = {}
    allowed, refused = RequeuePolicy(True, max_restarts=3), RequeuePolicy(False, max_restarts=3)
    assert after_hang(tmp_path, summary, slurm_job_id=None, policy=allowed).startswith(
        "ended (not a Slurm job"
    )
    assert after_hang(tmp_path, summary, slurm_job_id="12", policy=refused).startswith(
        "ended (checkpoint.requeue=false"
    )
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert (
        after_hang(tmp_path, summary, slurm_job_id="12", policy=allowed)
        == "ended: restarted 3 times (checkpoint.max_restarts=3)"
    )


def test_the_slurm_launcher_reports_the_hang_of_the_last_attempt_only(tmp_path) -> None:
    from toolkit.executors.slurm import last_hang
    from toolkit.fault.hang import new_hang_dir, write_hang_summary

    (tmp_path / "slurm.json").write_text("{}")
    base = {
        "stuck_ranks": [1],
        "stuck_hosts": ["n2"],
        "waiting_ranks": [0],
        "collective": None,
        "stuck_for_s": 10.0,
        "step": 3,
        "hosts_by_rank": {"0": "n1", "1": "n2"},
    }
    write_hang_summary(new_hang_dir(tmp_path), {**base, "message": "hang: first", "attempt": 0})
    assert last_hang(tmp_path, attempt=0) == "hang: first"
    assert last_hang(tmp_path, attempt=1) is None  # requeued after it; attempt 1 ended otherwise
