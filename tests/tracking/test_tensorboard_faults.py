"""TensorBoard under faults: a short script with no process group keeps every record and
never aborts its rank; a write that fails (the file size limit, as a full disk would) is
one warning, not a thread's traceback. Read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, launch

SOLO = str(REPO / "tests" / "fixtures" / "scripts" / "solo_session.py")


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_short_script_without_a_process_group_keeps_every_tensorboard_record(tmp_path):
    """should_stop() each step beside tracking=tensorboard, in a script that imports no torch
    and ends within a second. Before: torch imported by the tracker's thread and the
    script's at once aborted the rank (exit 134), and a tracker still opening when the
    script ended lost its records ("can't register atexit after shutdown")."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    r = launch(
        f"script.path={SOLO}",
        "script.args=[--steps,3]",
        "cluster.tasks_per_node=2",
        "tracking=tensorboard",
        "telemetry=off",
        f"hydra.run.dir={run}",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "done after step 3" in r.stdout
    assert "Traceback" not in r.stderr and "tracking: tensorboard" not in r.stderr, r.stderr
    events = EventAccumulator(str(run / "tracking" / "tensorboard")).Reload()
    losses = [(s.step, round(s.value, 4)) for s in events.Scalars("train/loss")]
    assert losses == [(1, 1.0), (2, 0.5), (3, 0.3333)]


FULL_DISK = """
import logging, resource, signal, sys, time
from pathlib import Path
from toolkit.config.tracking import TrackingConfig
from toolkit.events import StepRecord
from toolkit.tracking.build import build_tracking_sinks

logging.basicConfig(level=logging.WARNING, format="%(message)s")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
(trackers,) = build_tracking_sinks(TrackingConfig(tensorboard=True), True, Path(sys.argv[1]), {})
for step in range(1, 401):
    trackers.write_step(StepRecord(step=step, loss=1.0, step_time_s=0.1, data_wait_s=0.0,
        forward_backward_s=0.0, optimizer_s=0.0, tokens=1, tokens_per_s=10.0, mfu=0.0,
        grad_norm=0.0, lr=0.0, mem_peak_bytes=0, wall_time=time.time(), rank=0))
    time.sleep(0.002)
trackers.close()
print("training went on")
"""


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_tensorboard_write_failure_is_one_warning_not_a_thread_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "training went on\n", done.stderr
    failed = [line for line in done.stderr.splitlines() if "tensorboard" in line]
    assert failed[0].startswith("tracking: tensorboard: logging failed: OSError: [Errno 27]")
    # One line per kind of failure (writing, spooling what was missed, closing), then the
    # count at close.
    kinds = [line.split(": ")[2] for line in failed[:-1]]
    assert kinds == ["logging failed", "could not spool", "could not finish"], failed
    assert failed[-1].startswith("tracking: tensorboard dropped 400 record(s)")
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr
