"""What happens to the job after a hang: the one call point the hang watchdog makes once
the evidence is on disk (toolkit.telemetry.watchdog), before it ends the local ranks.

Under Slurm, while `checkpoint.max_restarts` allows, the job is requeued to resume from its
last committed checkpoint, leaving out the node the hang summary names as stuck
(toolkit.executors.slurm_exclude: the same decision as for a failed node, which never
excludes so many nodes that the job could not be scheduled; then the job ends instead).

The watchdog runs it as its own process (`python -m toolkit.executors.after_hang`, a JSON
request on stdin, a JSON answer on stdout, under a time limit): job control stays out of the
telemetry agent, and a stuck `scontrol` or a crash here cannot keep the agent from ending the
hung ranks.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from toolkit.executors.requeue import JobShape, RequeuePolicy
from toolkit.executors.slurm_exclude import requeue_with_exclusion

log = logging.getLogger(__name__)


def after_hang(
    run_dir: Path,
    summary: dict[str, Any],
    *,
    slurm_job_id: str | None,
    policy: RequeuePolicy,
) -> str:
    """Act on a hang described by `summary` (toolkit.fault.hang, already on disk) under the
    job's requeue policy (its `requeue` is false when checkpointing is off too); returns
    what was done, in a few words, for the summary's `action` and the log."""
    job_id = slurm_job_id
    if job_id is None:
        return "ended (not a Slurm job: nothing to requeue)"
    if not policy.requeue:
        return "ended (checkpoint.requeue=false or checkpointing off)"
    restarts, max_restarts = policy.restarts(), policy.max_restarts
    if policy.exhausted(restarts):
        return f"ended: restarted {restarts} times (checkpoint.max_restarts={max_restarts})"
    shape = policy.shape
    since = float(summary.get("time_unix") or 0.0) - 1.0  # this hang's summary, not older ones
    requeued, decision = requeue_with_exclusion(run_dir, job_id, restarts, shape, since=since)
    if not decision.schedulable:
        return f"ended: {decision.message}"
    if not requeued:
        return f"ended: scontrol requeue {job_id} failed"
    left_out = f", without {','.join(decision.exclude)}" if decision.exclude else ""
    log.warning("hang: requeued job %s (restart %d)%s", job_id, restarts + 1, left_out)
    return f"requeued job {job_id} (restart {restarts + 1} of {max_restarts}){left_out}"


def main() -> int:
    """The watchdog's call: {"run_dir", "summary", "slurm_job_id", "requeue", "max_restarts",
    "nodes", "exclude", "partition", "exclude_nodes"} on stdin -> {"action": ...} on stdout."""
    # `scontrol requeue` ends this job's processes, this one included (SIGTERM, then SIGKILL
    # after Slurm's KillWait): the exclude list is set right after the requeue, so the
    # SIGTERM must not end it first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    request = json.loads(sys.stdin.read())
    shape = JobShape(
        int(request["nodes"]),
        request.get("exclude"),
        request.get("partition"),
        bool(request["exclude_nodes"]),
    )
    policy = RequeuePolicy(bool(request["requeue"]), int(request["max_restarts"]), shape)
    action = after_hang(
        Path(request["run_dir"]),
        dict(request["summary"]),
        slurm_job_id=request.get("slurm_job_id"),
        policy=policy,
    )
    if action.startswith("ended"):  # no next attempt will send it to the trackers
        send_to_trackers(Path(request["run_dir"]), action)
    print(json.dumps({"action": action}))
    return 0


def send_to_trackers(run_dir: Path, action: str) -> None:
    """The hang that ends the job, to the run's trackers (tracking=...), once; a failure is
    logged, never in the way of ending the hung ranks."""
    try:
        from toolkit.config.compose import job_to_dict, load_job
        from toolkit.tracking.build import send_final_hangs

        job = load_job(run_dir / "config.yaml")
        send_final_hangs(job.tracking, run_dir, job_to_dict(job), action)
    except Exception:  # noqa: BLE001
        log.exception("hang: not sent to the trackers")


if __name__ == "__main__":
    sys.exit(main())
