"""A node agent that dies while training runs is started again: training goes on, the new
agent writes the node's records and the hang watchdog comes back with it. With
telemetry.on_agent_lost=stop, an agent gone for good stops the run instead, cleanly."""

from __future__ import annotations

import re
import signal

import psutil
import pytest

from tests.checkpoint.conftest import start as start  # noqa: F401 - the fixture
from tests.checkpoint.conftest import wait_for
from toolkit.checkpoint.layout import MANIFEST, step_name
from toolkit.errors import EXIT_TELEMETRY_LOST
from toolkit.telemetry.read import node_files


def agents(launcher_pid: int) -> list[psutil.Process]:
    """The node agents running under the launcher (not a killed one waiting to be reaped)."""
    found = []
    for p in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if "toolkit.telemetry.agent" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # gone, or a zombie
            continue
    return found


@pytest.mark.slow
@pytest.mark.waits
def test_a_killed_node_agent_is_restarted_and_training_goes_on(tmp_path, start):
    run_dir = tmp_path / "run"
    job = start(
        run_dir, "fault.data_delay_s=0.3", "trainer.steps=12", "telemetry.flush_interval_s=0.3"
    )
    steps = run_dir / "metrics" / "rank0.jsonl"
    wait_for(lambda: steps.exists() and steps.read_text().strip(), what="the first step")
    (first,) = agents(job.pid)
    first.send_signal(signal.SIGKILL)
    wait_for(lambda: [a.pid for a in agents(job.pid)] not in ([], [first.pid]), what="a new one")

    out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, out
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"telemetry: node agent (pid {first.pid}) exited with -9; restarted as pid" in log
    assert len(node_files(run_dir)) == 2  # the new agent's records, beside the first one's


@pytest.mark.slow
@pytest.mark.waits
def test_a_node_agent_lost_for_good_stops_the_run_with_its_checkpoint(tmp_path, start):
    run_dir = tmp_path / "run"
    job = start(
        run_dir,
        "fault.data_delay_s=0.3",
        "trainer.steps=200",
        "telemetry.agent_restarts=0",
        "telemetry.on_agent_lost=stop",
        "checkpoint.enabled=true",
        "checkpoint.interval_steps=1000",
    )
    steps = run_dir / "metrics" / "rank0.jsonl"
    wait_for(lambda: steps.exists() and steps.read_text().strip(), what="the first step")
    (agent,) = agents(job.pid)
    agent.send_signal(signal.SIGKILL)

    out, _ = job.communicate(timeout=120)
    assert job.returncode == EXIT_TELEMETRY_LOST, out
    (line,) = [x for x in out.splitlines() if x.startswith("error: telemetry:")]
    stopped = int(re.search(r"stopped after step (\d+)", line).group(1))
    assert "telemetry.on_agent_lost=stop" in line and "Traceback" not in out
    assert 1 <= stopped < 200
    # Like a preemption stop: the step it stopped at is committed, to resume from.
    assert (run_dir / "checkpoints" / step_name(stopped) / MANIFEST).is_file()
