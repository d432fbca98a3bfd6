"""The hang watchdog across two nodes of the real dev cluster: the agents of both nodes meet
in RUN_DIR/hangs/, every rank's stacks are dumped, the summary names the rank and node that
did not reach the collective, and the launcher exits 79 with the one line; the job is not
requeued, so its after-hang action sends the hang to the run's trackers."""

from __future__ import annotations

import time

import pytest

from tests.executors.test_slurm_executor import TINY, launch
from tests.tracking.test_hang_event import hang_texts
from toolkit.errors import EXIT_HANG
from toolkit.fault.hang import read_hang_summary

pytestmark = pytest.mark.slurm


def test_a_hung_rank_on_the_second_node_is_named_and_the_job_ends_79(slurm_cluster, tmp_path):
    started = time.monotonic()
    proc = launch(
        slurm_cluster,
        *TINY,
        "trainer.steps=100000",
        "fault.hang_at_step=3",
        "fault.hang_rank=1",
        "fault.hang_timeout_s=10",
        "fault.hang_startup_timeout_s=120",
        "checkpoint.enabled=false",  # nothing to resume from: no requeue
        "cluster=slurm",
        "cluster.nodes=2",
        "tracking=tensorboard",
        f"hydra.run.dir={tmp_path}",
        timeout_s=300,
    )
    assert proc.returncode == EXIT_HANG, proc.stderr[-3000:]
    assert time.monotonic() - started < 240
    hang = next(p for p in (tmp_path / "hangs").iterdir() if not p.name.startswith("."))
    summary = read_hang_summary(hang)
    host_of_1 = summary["hosts_by_rank"]["1"]
    assert host_of_1 != summary["hosts_by_rank"]["0"]  # one rank per node
    assert summary["stuck_ranks"] == [1] and summary["stuck_hosts"] == [host_of_1]
    assert summary["waiting_ranks"] == [0]
    assert summary["collective"]["op"] == "all_reduce"
    assert sorted(summary["nodes_reporting"]) == sorted(summary["hosts_by_rank"].values())
    assert summary["action"].startswith("ended")  # checkpointing off: not requeued
    for rank in (0, 1):
        assert "in train_step" in (hang / f"stacks-rank{rank}.txt").read_text()
    assert proc.stderr.strip().splitlines()[-1] == summary["message"]
    assert summary["message"].startswith(f"hang: rank 1 on node {host_of_1} stuck in all_reduce #")
    (sent,) = hang_texts(tmp_path)  # no next attempt: the after-hang action sent it
    assert (sent["dump"], sent["stuck_ranks"], sent["action"]) == (
        str(hang),
        "1",
        summary["action"],
    )
