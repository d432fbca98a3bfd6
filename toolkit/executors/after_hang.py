"""What happens to the job after a hang: the one call point the hang watchdog makes once
the evidence is on disk (toolkit.telemetry.watchdog), before it ends the local ranks.

Today: under Slurm, requeue the job (`preemption.requeue`) while `checkpoint.max_restarts`
allows, so that it resumes from its last committed checkpoint. The choice of nodes to leave
out at the requeue (the summary's `stuck_hosts`) extends this function.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from toolkit.distributed.env import restart_count
from toolkit.executors.preemption import requeue

log = logging.getLogger(__name__)


def after_hang(
    run_dir: Path,
    summary: dict[str, Any],
    *,
    slurm_job_id: str | None,
    requeue_enabled: bool,
    max_restarts: int,
) -> str:
    """Act on a hang described by `summary` (toolkit.fault.hang); returns what was done, in
    a few words, for the summary's `action` and the log."""
    if slurm_job_id is None:
        return "ended (not a Slurm job: nothing to requeue)"
    if not requeue_enabled:
        return "ended (checkpoint.requeue=false or checkpointing off)"
    restarts = restart_count()
    if restarts >= max_restarts:
        return f"ended: restarted {restarts} times (checkpoint.max_restarts={max_restarts})"
    if requeue(slurm_job_id):
        log.warning("hang: requeued job %s (restart %d)", slurm_job_id, restarts + 1)
        return f"requeued job {slurm_job_id} (restart {restarts + 1} of {max_restarts})"
    return f"ended: scontrol requeue {slurm_job_id} failed"
