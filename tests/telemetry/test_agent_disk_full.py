"""A node file that cannot be written (a full disk, a quota) is said while the run goes on:
the agent drops the rows, tells the rank that started it, which says it in one line in its
log (the console, for rank 0); the node file's attributes name the rows that are missing,
and the report shows them. The failure is real: the kernel's file-size limit
(RLIMIT_FSIZE), set once the node file exists, fails the agent's writes with EFBIG as a
full disk fails them with ENOSPC."""

from __future__ import annotations

import logging
import os
import re
import resource
import signal
import threading
import time
from pathlib import Path

from tests.telemetry.test_agent import record
from toolkit.config.telemetry import ReportConfig, TelemetryConfig
from toolkit.telemetry.agent import Agent
from toolkit.telemetry.read import load_node
from toolkit.telemetry.report.build import build_report
from toolkit.telemetry.report.verdict import summary_lines
from toolkit.telemetry.sink import TelemetrySink
from toolkit.telemetry.spec import AgentSpec
from toolkit.telemetry.transport import Receiver, socket_path


def spec_of(run_dir: Path) -> AgentSpec:
    cfg = TelemetryConfig(
        interval_s=0.1, flush_interval_s=0.2, gpu=False, host=False, infiniband=False
    )
    return AgentSpec(
        run_dir=str(run_dir),
        node="testnode",
        attempt=0,
        job_id="disk-full",
        node_rank=0,
        ranks=[0],
        world_size=1,
        num_nodes=1,
        socket=socket_path(run_dir, "testnode", "disk-full", 0),
        parent_pid=os.getppid(),  # the agent runs in this process: its parent is ours
        config=cfg,
        versions={},
        nccl_env={},
    )


def test_rows_that_cannot_be_written_are_said_in_one_line_and_named_in_the_file(tmp_path, caplog):
    spec = spec_of(tmp_path)
    agent = Agent(spec, [], {}, Receiver(spec.socket))
    sink = TelemetrySink(spec.config, 0, spec.socket, spec=spec)  # the rank that started it
    thread = threading.Thread(target=agent.run)
    caplog.set_level(logging.INFO, logger="toolkit.telemetry")
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a signal
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    said: list[str] = []
    try:
        # The "disk" is full from here on: no file may grow past the node file's size.
        resource.setrlimit(resource.RLIMIT_FSIZE, (agent.path.stat().st_size, old_limit[1]))
        thread.start()
        deadline = time.monotonic() + 20
        step = 0
        while not said and time.monotonic() < deadline:
            step += 1
            sink.write_step(record(0, step))
            time.sleep(0.05)
            said = [r.getMessage() for r in caplog.records if r.name == "toolkit.telemetry.sink"]
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)  # space again, for the close
        signal.signal(signal.SIGXFSZ, old_handler)
        sink.close()
        thread.join(timeout=20)

    assert said, "the rank never said that the node file was not written"
    line = said[0]
    assert line.startswith(f"telemetry: node file {agent.path} not written: File too large; ")
    dropped = re.search(r"; (\d+) rows dropped so far \(([^)]*)\)", line)
    assert dropped and "steps/rank0" in dropped.group(2).split(", ") and "\n" not in line
    # The agent's log has it in one line too, not a traceback per flush.
    agent_lines = [r for r in caplog.records if r.name == "toolkit.telemetry.h5store"]
    assert len(agent_lines) == 1 and agent_lines[0].exc_info is None
    # The report's list of missing data names the rows (RUN_DIR/telemetry/... attributes).
    node = load_node(agent.path)
    try:
        why, written = node.absent()["steps"], len(node.steps[0])
    finally:
        node.close()
    missing = re.fullmatch(r"partly: (\d+) rows not written \(File too large\)", why)
    assert missing, why
    assert int(missing.group(1)) + written == step  # every record sent: written or named
    report = build_report(tmp_path, None, ReportConfig(sacct=False, plots=False, export=False))
    assert report.absent["steps"] == f"{why} (e.g. testnode)"
    # No step record was written: the report's first line says the disk filled, not "was
    # the node agent killed?"
    assert written == 0
    assert summary_lines(report.verdict)[0] == (
        "dominant cost: not measured: disk full: the node agent could not write the step "
        f"records ({why} (e.g. testnode)); free space under RUN_DIR/telemetry or set "
        "telemetry=off"
    )
