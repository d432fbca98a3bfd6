"""The node agent as a real process: ranks' records reach the node file, which other
processes can read while it is written and after the agent is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.telemetry.fakes import make_mlx5_tree
from toolkit.config.telemetry import TelemetryConfig
from toolkit.events import Event, StepRecord
from toolkit.telemetry.read import load_node, node_files
from toolkit.telemetry.sink import TelemetrySink, start_agent
from toolkit.telemetry.spec import AgentSpec
from toolkit.telemetry.transport import Sender, socket_path

pytestmark = pytest.mark.timeout(60)


def record(rank: int, step: int) -> StepRecord:
    return StepRecord(
        step=step,
        wall_time=1000.0 + step,
        step_time_s=0.5,
        data_wait_s=0.01,
        forward_backward_s=0.4,
        optimizer_s=0.09,
        loss=3.0 - step / 100,
        grad_norm=1.0,
        lr=1e-3,
        tokens=4096,
        tokens_per_s=8192.0,
        mfu=0.4,
        mem_peak_bytes=1 << 30,
        rank=rank,
    )


def agent_spec(run_dir: Path, sysfs: Path, ranks=(0, 1)) -> tuple[AgentSpec, TelemetryConfig]:
    cfg = TelemetryConfig(interval_s=0.1, flush_interval_s=0.2, sysfs_root=str(sysfs))
    spec = AgentSpec(
        run_dir=str(run_dir),
        node="testnode",
        attempt=0,
        job_id="777",
        node_rank=0,
        ranks=list(ranks),
        world_size=len(ranks),
        num_nodes=1,
        socket=socket_path(run_dir, "testnode", "777", 0),
        parent_pid=os.getpid(),
        config=cfg,
        versions={"torch": "2.13.0"},
        nccl_env={"NCCL_IB_HCA": "mlx5_0,mlx5_1"},
    )
    return spec, cfg


def wait_for_rows(run_dir: Path, table: str, rows: int, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        files = node_files(run_dir)
        if files:
            try:
                node = load_node(files[0])
                group, _, rank = table.partition("/")
                seen = (
                    len(node.steps[int(rank.removeprefix("rank"))])
                    if group == "steps"
                    else len(node.host)
                )
                node.close()
            except (OSError, KeyError):
                seen = 0
            if seen >= rows:
                return seen
        time.sleep(0.1)
    raise AssertionError(f"{table}: {seen} rows after {timeout_s} s, wanted {rows}")


def test_records_from_every_rank_reach_the_file_readable_while_written(tmp_path):
    spec, cfg = agent_spec(tmp_path, make_mlx5_tree(tmp_path / "ib"))
    agent = start_agent(spec, tmp_path, "testnode")
    owner = TelemetrySink(cfg, 0, spec.socket, agent)
    other = TelemetrySink(cfg, 1, spec.socket)
    for step in range(1, 31):
        owner.write_step(record(0, step))
        other.write_step(record(1, step))
    owner.write_event(Event("checkpoint", 1010.0, 1012.5, 10, 0, {"phase": "stall"}))
    # Records sent before the agent bound its socket wait in the sender; the next send (in
    # training: the next step) or an explicit flush delivers them.
    assert owner.sender.flush(timeout_s=15) and other.sender.flush(timeout_s=15)
    # Another process (this one) reads the file while the agent keeps writing it.
    assert wait_for_rows(tmp_path, "steps/rank1", 30) == 30
    other.close()
    owner.close()  # waits for the agent's final flush
    assert agent.returncode == 0
    node = load_node(node_files(tmp_path)[0])
    try:
        assert node.path.name == "node-testnode-attempt0.h5"
        assert node.ranks == [0, 1] and node.job_id == "777"
        assert node.attrs["nccl_env"] == '{"NCCL_IB_HCA": "mlx5_0,mlx5_1"}'
        assert "gpu_absent_reason" in node.attrs  # no NVML on this machine
        steps = node.steps[0]
        assert list(steps["step"]) == list(range(1, 31))
        assert steps["loss"].dtype == np.float64 and steps["step"].dtype == np.int64
        assert steps.units("step_time_s") == "s"
        assert [e["name"] for e in node.events] == ["checkpoint"]
        assert node.events[0]["attrs"] == {"phase": "stall"}
        assert sorted(node.ib) == ["mlx5_0_1", "mlx5_1_1"]
        assert len(node.host) >= 2 and len(node.ib["mlx5_0_1"]) == len(node.host)
    finally:
        node.close()


def test_file_stays_readable_after_the_agent_is_sigkilled(tmp_path):
    spec, cfg = agent_spec(tmp_path, tmp_path / "no-ib")
    agent = start_agent(spec, tmp_path, "testnode")
    sink = TelemetrySink(cfg, 0, spec.socket)
    for step in range(1, 21):
        sink.write_step(record(0, step))
    assert sink.sender.flush(timeout_s=15)
    wait_for_rows(tmp_path, "steps/rank0", 20)
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    for step in range(21, 41):  # the agent is gone: training goes on, nothing raises
        sink.write_step(record(0, step))
    node = load_node(node_files(tmp_path)[0])
    try:
        assert list(node.steps[0]["step"]) == list(range(1, 21))
        assert len(node.host) >= 1
        assert "ib_absent_reason" in node.attrs
    finally:
        node.close()
    sink.cfg.close_timeout_s = 0.2
    sink.close()


def test_sender_without_agent_never_raises_and_bounds_its_queue(tmp_path):
    sender = Sender(str(tmp_path / "nobody.sock"), max_pending=10)
    for step in range(100):
        sender.send({"kind": "step", "step": step})
    assert len(sender.pending) == 10 and sender.dropped == 90
    assert sender.flush(timeout_s=0.05) is False
    sender.close()


def test_a_local_rerun_into_the_same_run_dir_gets_the_next_attempt_file(tmp_path):
    for _ in range(2):
        spec, cfg = agent_spec(tmp_path, tmp_path / "no-ib", ranks=(0,))
        agent = start_agent(spec, tmp_path, "testnode")
        sink = TelemetrySink(cfg, 0, spec.socket, agent)
        sink.write_step(record(0, 1))
        sink.close()
    assert [p.name for p in node_files(tmp_path)] == [
        "node-testnode-attempt0.h5",
        "node-testnode-attempt1.h5",
    ]


def test_the_agent_flushes_and_stops_when_its_rank_dies_without_closing(tmp_path):
    """Rank 0 crashes (os._exit, as the entrypoint does on failure): the agent notices its
    parent is gone, writes what it received and exits."""
    script = f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.telemetry.test_agent import agent_spec, record
from pathlib import Path
from toolkit.telemetry.sink import TelemetrySink, start_agent
spec, cfg = agent_spec(Path({str(tmp_path)!r}), Path({str(tmp_path / "no-ib")!r}), ranks=(0,))
agent = start_agent(spec, Path({str(tmp_path)!r}), "testnode")
print(agent.pid, flush=True)
sink = TelemetrySink(cfg, 0, spec.socket, agent)
for step in range(1, 11):
    sink.write_step(record(0, step))
sink.sender.flush(15)
os._exit(1)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    agent_pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and Path(f"/proc/{agent_pid}").exists():
        time.sleep(0.1)
    log = (tmp_path / "logs" / "telemetry-testnode.log").read_text()
    assert "parent rank process is gone" in log
    node = load_node(node_files(tmp_path)[0])
    try:
        assert list(node.steps[0]["step"]) == list(range(1, 11))
    finally:
        node.close()


def test_sigterm_flushes_at_once_and_keeps_recording_until_the_ranks_close(tmp_path):
    """Slurm SIGTERMs every process of the step at preemption: the agent writes what it has
    right away, then still records the ranks' last steps until they close."""
    spec, cfg = agent_spec(tmp_path, tmp_path / "no-ib", ranks=(0,))
    spec.config.flush_interval_s = 600.0  # no periodic flush during the test
    agent = start_agent(spec, tmp_path, "testnode")
    sink = TelemetrySink(cfg, 0, spec.socket, agent)
    for step in range(1, 6):
        sink.write_step(record(0, step))
    assert sink.sender.flush(timeout_s=15)
    time.sleep(0.5)  # let the agent take them in
    agent.send_signal(signal.SIGTERM)
    assert wait_for_rows(tmp_path, "steps/rank0", 5, timeout_s=10) == 5
    sink.write_event(Event("preemption", 2000.0, 2000.0, 5, 0, {"signal": "SIGTERM"}))
    sink.close()  # goodbye: the agent writes the event and exits
    assert agent.returncode == 0
    node = load_node(node_files(tmp_path)[0])
    try:
        assert [e["name"] for e in node.events] == ["preemption"]
    finally:
        node.close()
