"""The hang watchdog's parts on their own: the fault.hang_* validation, the heartbeat the
collectives write (real gloo group), naming the stuck rank from heartbeats, the one line,
the default timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.validate import validate
from toolkit.distributed.commtime import CommTimer
from toolkit.fault.hang import DUMP_SIGNAL, diagnose, one_line
from toolkit.telemetry.heartbeat import Heartbeat, read_heartbeat
from toolkit.telemetry.watchdog import default_timeout_s

BAD = [
    ("fault.hang_timeout_s=0", "fault.hang_timeout_s=0.0: must be > 0 (or null: the default)"),
    ("fault.hang_startup_timeout_s=-1", "fault.hang_startup_timeout_s=-1.0: must be > 0"),
    ("fault.hang_at_step=0", "fault.hang_at_step=0: must be >= 1 (or null)"),
    ("fault.hang_rank=-2", "fault.hang_rank=-2: must be >= 0"),
    (
        "fault.hang_where=inside",
        "fault.hang_where='inside': must be one of collective, outside",
    ),
]


@pytest.mark.parametrize(("override", "message"), BAD, ids=[o for o, _ in BAD])
def test_bad_hang_settings_are_one_line_each(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(to_job(compose_raw([override])))
    assert message in str(err.value)


def test_the_startup_limit_is_not_shorter_than_the_step_limit() -> None:
    with pytest.raises(ConfigError, match="startup is the longer limit"):
        validate(
            to_job(compose_raw(["fault.hang_timeout_s=100", "fault.hang_startup_timeout_s=50"]))
        )


def test_the_default_timeout_is_five_minutes_or_ten_median_steps() -> None:
    assert default_timeout_s([]) == 300.0
    assert default_timeout_s([1.0, 2.0, 100.0]) == 300.0
    assert default_timeout_s([40.0, 50.0, 60.0]) == 500.0


def test_collectives_write_which_one_a_rank_is_in(tmp_path, single_rank_group) -> None:
    beat = Heartbeat(tmp_path / "r0.hb")
    timer = CommTimer(progress=beat, timing=False).install()
    try:
        t = torch.ones(4)
        dist.all_reduce(t)
        after_sync = read_heartbeat(beat.path)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        work = gather(torch.empty(4), t, async_op=True)
        issued = read_heartbeat(beat.path)
        work.wait()
        done = read_heartbeat(beat.path)
    finally:
        timer.uninstall()
        beat.close(remove=False)
    assert after_sync["entered_seq"] == 1 and after_sync["entered_op"] == "all_reduce"
    assert after_sync["blocked_seq"] == 0  # left it
    assert issued["entered_seq"] == 2 and issued["entered_op"] == "all_gather"
    assert done["blocked_seq"] == 0 and done["progress"] > issued["progress"]
    assert timer.take() == (
        dict.fromkeys(("all_gather", "reduce_scatter", "all_reduce", "p2p"), 0.0),
        0.0,
    )
    assert read_heartbeat(beat.path)["phase"] == "end"


def test_the_loop_phases_and_the_pid_are_in_the_heartbeat(tmp_path) -> None:
    beat = Heartbeat(tmp_path / "r0.hb")
    beat.beat("hooks", 7)
    seen = read_heartbeat(beat.path)
    assert seen["phase"] == "hooks" and seen["step"] == 7 and seen["pid"] == os.getpid()
    assert oct(os.stat(beat.path).st_mode & 0o777) == "0o600"
    beat.close()
    assert read_heartbeat(tmp_path / "r0.hb") is None


def rank(r: int, host: str, step: int, entered: int, blocked: int, idle: float) -> dict:
    return {
        "rank": r,
        "host": host,
        "step": step,
        "entered_seq": entered,
        "entered_op": "all_gather",
        "blocked_seq": blocked,
        "blocked_op": "all_gather" if blocked else "none",
        "idle_s": idle,
        "moved_unix": 1000.0 - idle,  # every agent's snapshot at 1000.0
    }


def test_the_ranks_that_did_not_reach_the_awaited_collective_are_stuck() -> None:
    ranks = [rank(r, f"n{r // 8 + 1}", 20, 8812, 8812, 612.0) for r in range(16)]
    ranks[5] = rank(5, "n1", 20, 8811, 0, 612.4)
    ranks[13] = rank(13, "n2", 20, 8810, 0, 612.9)
    found = diagnose(ranks)
    assert found["stuck_ranks"] == [5, 13]
    assert found["stuck_hosts"] == ["n1", "n2"]
    assert found["collective"] == {"op": "all_gather", "seq": 8812}
    assert found["waiting_ranks"] == [r for r in range(16) if r not in (5, 13)]
    assert found["stuck_for_s"] == 612.9
    summary = {**found, "message": ""}
    assert (
        one_line(summary, Path("/runs/x/hangs/T"))
        == "hang: ranks 5,13 on nodes n1,n2 stuck in all_gather #8812 for 613 s; dumps in /runs/x/hangs/T"
    )


def test_with_nobody_in_a_collective_the_longest_idle_ranks_are_named() -> None:
    ranks = [rank(0, "n1", 4, 30, 0, 9.0), rank(1, "n1", 4, 30, 0, 20.0)]
    found = diagnose(ranks)
    assert found["stuck_ranks"] == [1] and found["collective"] is None
    assert one_line({**found, "message": ""}, Path("D")).startswith(
        "hang: rank 1 on node n1 stuck outside collectives at step 4 for 20 s"
    )


def test_ranks_on_two_nodes_are_compared_by_when_they_stopped_not_by_each_agents_idle_time():
    """The summary of a 2-node script run: the hung rank 1's agent took its snapshot a second
    before the leader's, so its idle time reads 1 s shorter though it stopped first. On the
    wall clock the two stopped 0.5 s apart: both are named (the waiting one cannot be told
    apart in a script that reports no collectives)."""
    ranks = [
        {**rank(0, "n1", 0, 0, 0, 9.0), "moved_unix": 1000.5},  # snapshot at 1009.5
        {**rank(1, "n2", 0, 0, 0, 8.0), "moved_unix": 1000.0},  # snapshot at 1008.0
    ]
    assert diagnose(ranks)["stuck_ranks"] == [0, 1]
    ranks[0]["moved_unix"] = 1003.0  # rank 0 went on 3 s longer: rank 1 alone
    assert diagnose(ranks)["stuck_ranks"] == [1]


def test_the_dump_signal_writes_every_thread_even_while_blocked(tmp_path) -> None:
    """A child installs the dump, blocks in a sleep; the signal writes its stacks."""
    code = (
        "import sys, time; from pathlib import Path; "
        "from toolkit.fault.hang import install_stack_dump; "
        f"print(install_stack_dump(Path({str(tmp_path)!r}), 3), flush=True); "
        "def blocked_here(): time.sleep(60)\n"
        "blocked_here()"
    )
    code = code.replace("; def", "\ndef")
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
    )
    try:
        path = Path(proc.stdout.readline().strip())
        time.sleep(0.3)
        os.kill(proc.pid, DUMP_SIGNAL)
        deadline = time.time() + 10
        while time.time() < deadline and "blocked_here" not in path.read_text():
            time.sleep(0.1)
        assert "in blocked_here" in path.read_text()
        assert proc.poll() is None, "the signal must not end the process"
        assert DUMP_SIGNAL not in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
    finally:
        proc.kill()
        proc.wait()
