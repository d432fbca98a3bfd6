"""Requeue with bad nodes left out, on Slurm: gather the evidence, decide
(`toolkit.executors.exclusion.decide`), set the job's ExcNodeList, record why.

Slurm changes a job's ExcNodeList only while it is pending, so the list is set in the moment
between a requeue and the next start:
- a requeue the toolkit makes (preemption, a hang): `requeue_with_exclusion`, right after
  `scontrol requeue` and in the same `scontrol update` as StartTime=now;
- a requeue Slurm makes itself (NODE_FAIL with --requeue): the launcher following the job
  sees it pending again and calls `exclude_while_pending`, which also sets StartTime=now
  (Slurm holds a requeued job for ~120 s otherwise);
- a rank that died with a hardware error fails the job (srun --kill-on-bad-exit); the
  following launcher requeues it with the node left out (`requeue_after_failure`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from toolkit import slurm_cli
from toolkit.executors import badnodes
from toolkit.executors.exclusion import BadNode, Decision, decide, hostnames
from toolkit.executors.requeue import JobShape, RequeuePolicy
from toolkit.slurm_records import Attempt, parse_time

log = logging.getLogger(__name__)

# sinfo's short states of nodes that can take a job (a trailing '*' = not responding).
USABLE_STATES = frozenset({"idle", "mix", "alloc", "comp", "resv", "plnd"})
DOWN_STATES = ("down", "drain", "drng", "fail", "failg", "maint", "unk", "boot", "npc")


def usable(state: str) -> bool:
    return not state.endswith("*") and state.rstrip("~#$@^-+!%") in USABLE_STATES


def is_down(state: str) -> bool:
    return state.endswith("*") or state.rstrip("~#$@^-+!%*").startswith(DOWN_STATES)


def attempts(job_id: str, attempt: int, wait_s: float = 0.0) -> list[Attempt]:
    """Every attempt of the job in accounting; waits up to wait_s for accounting to record
    attempt `attempt` as ended (slurmdbd lags a moment)."""
    deadline = time.monotonic() + wait_s
    while True:
        rows = slurm_cli.attempts(job_id)
        if (attempt < len(rows) and rows[attempt].ended) or time.monotonic() >= deadline:
            return rows
        time.sleep(0.5)


def node_down_events(nodes: list[str], start: str, end: str) -> dict[str, str]:
    """{node: reason} of the nodes that Slurm's accounting saw go down, drained or failed
    between start and end (+60 s): the record survives the node's return to service."""
    limit = parse_time(end)
    found: dict[str, str] = {}
    for e in slurm_cli.node_events(nodes, start):
        if e.node not in nodes:
            continue
        when = parse_time(e.start)
        if limit is not None and when is not None and when > limit + 60:
            continue
        if e.state.upper().startswith(("DOWN", "FAIL", "DRAIN")):
            found.setdefault(e.node, e.reason or e.state)
    return found


def node_fail(job_id: str, attempt: int, wait_s: float = 0.0) -> list[BadNode]:
    """When accounting reports attempt `attempt` of the job as NODE_FAIL: the nodes of that
    attempt that went down meanwhile (Slurm's node events), or that are down, drained or not
    responding now."""
    rows = attempts(job_id, attempt, wait_s)
    if attempt >= len(rows) or not rows[attempt].state.startswith("NODE_FAIL"):
        return []
    row = rows[attempt]
    nodes = hostnames(row.nodelist)
    events = node_down_events(nodes, row.start, row.end)
    states = slurm_cli.node_states(nodes=nodes)
    down = [n for n in nodes if n in events or is_down(states.get(n, "down"))]
    if not down:
        log.warning("job %s attempt %d: NODE_FAIL, but none of %s went down", job_id, attempt,
                    ",".join(nodes))  # fmt: skip
    why = {n: f"node down: {events[n]}" if n in events else f"node {states.get(n)}" for n in down}
    return [BadNode(n, f"NODE_FAIL, {why[n]}", attempt, "slurm") for n in down]


def evidence(
    run_dir: Path, job_id: str, attempt: int, since: float | None, wait_s: float = 0.0
) -> list[BadNode]:
    """Everything against a node in attempt `attempt` of the job."""
    return [
        *node_fail(job_id, attempt, wait_s),
        *badnodes.marks(run_dir, attempt),
        *badnodes.hang_hosts(run_dir, attempt, since),
        *badnodes.telemetry_nodes(run_dir, attempt),
    ]


def plan(
    run_dir: Path,
    job_id: str,
    attempt: int,
    shape: JobShape,
    extra: list[BadNode] | None = None,
    since: float | None = None,
    wait_s: float = 0.0,
) -> Decision:
    """The decision for the requeue after attempt `attempt` (asks Slurm; changes nothing)."""
    try:
        records = slurm_cli.show_job(job_id) or []
    except slurm_cli.SlurmCommandError:
        records = []  # slurmctld no longer knows the job, or cannot be asked
    job = records[0] if records else None
    already = hostnames(job.exc_node_list if job else None) + hostnames(shape.exclude)
    already += [str(e.get("node")) for e in badnodes.excluded(run_dir)]
    partition = shape.partition or (job.partition if job else "") or None
    states = slurm_cli.node_states(partition)
    bad = [*(extra or []), *evidence(run_dir, job_id, attempt, since, wait_s)]
    # sinfo not answering: the count of usable nodes is unknown, not zero.
    up = [n for n, s in states.items() if usable(s)] if states else None
    if up is None:
        log.warning("job %s: sinfo did not list partition %s's nodes", job_id, partition)
    return decide(bad, already, up, shape.nodes, shape.enabled)


def act(run_dir: Path, job_id: str, decision: Decision) -> None:
    """Record a decision that excludes nodes (excluded_nodes.json), and say it."""
    if decision.added:
        badnodes.record(run_dir, decision, job_id)
        log.warning("job %s: %s", job_id, decision.message)
    elif decision.ignored:
        log.warning("job %s: %s", job_id, decision.message)


def requeue_with_exclusion(
    run_dir: Path,
    job_id: str,
    attempt: int,
    shape: JobShape,
    extra: list[BadNode] | None = None,
    since: float | None = None,
) -> tuple[bool, Decision]:
    """In-job requeue (preemption, hang): decide; when the job can still be scheduled,
    `scontrol requeue` it and set the exclude list with StartTime=now. (requeued, decision)

    The call point after a hang: `extra` may carry the hang's own evidence; else the
    newest hang summary written at or after `since` (the attempt's start) is read."""
    decision = plan(run_dir, job_id, attempt, shape, extra, since)
    if not decision.schedulable:
        log.error("job %s: %s", job_id, decision.message)
        return False, decision
    act(run_dir, job_id, decision)
    return slurm_cli.requeue(job_id, exclude=decision.exclude), decision


def exclude_while_pending(run_dir: Path, job_id: str, attempt: int, shape: JobShape) -> Decision:
    """Slurm requeued the job after attempt `attempt` (NODE_FAIL) and it is pending: leave the
    bad nodes out and start it now; when it could no longer be scheduled, cancel it."""
    decision = plan(run_dir, job_id, attempt, shape, wait_s=15.0)
    if not decision.schedulable:
        slurm_cli.cancel(job_id)
        return decision
    act(run_dir, job_id, decision)
    slurm_cli.start_requeued(job_id, decision.exclude, tries=2)
    return decision


def requeue_after_failure(run_dir: Path, job_id: str, attempt: int, shape: JobShape) -> Decision:
    """The job FAILED: when a rank's node was marked bad (a hardware error) in that attempt,
    requeue it without that node; nothing happens otherwise (a program error fails again)."""
    bad = [b for b in badnodes.marks(run_dir, attempt) if b.source == "rank"]
    if not bad:
        return Decision([], [], False, "no hardware error: not requeueing")
    decision = plan(run_dir, job_id, attempt, shape)
    if not decision.schedulable or not decision.added:
        return decision
    act(run_dir, job_id, decision)
    try:
        slurm_cli.requeue_job(job_id)
    except slurm_cli.SlurmCommandError as exc:
        why = f"scontrol requeue failed: {exc}"
        return Decision(decision.exclude, decision.added, False, why)
    slurm_cli.start_requeued(job_id, decision.exclude)
    return decision


class RequeueWatch:
    """The launcher's part, while it follows a job: a requeue Slurm made (NODE_FAIL) gets
    the bad nodes excluded while pending; a job failed by a hardware error is requeued
    without its node (while the requeue policy allows)."""

    def __init__(self, run_dir: Path, job_id: str, policy: RequeuePolicy):
        self.run_dir, self.job_id, self.policy = run_dir, job_id, policy
        self.shape = policy.shape
        self.handled = 0  # the restart count already looked at
        self.stopped: Decision | None = None  # a decision that ended the job

    def on_state(self, state: str, restarts: int) -> None:
        if restarts <= self.handled or state != "PENDING":
            return
        self.handled = restarts
        try:
            decision = exclude_while_pending(self.run_dir, self.job_id, restarts - 1, self.shape)
        except (OSError, slurm_cli.SlurmCommandError) as exc:
            log.warning("job %s: could not review its nodes after a requeue: %s", self.job_id, exc)
            return
        if not decision.schedulable:
            self.stopped = decision

    def after_failure(self, restarts: int) -> bool:
        """The job ended FAILED after `restarts` requeues: requeue it without a node that
        had a hardware error (True), or leave it failed (False)."""
        if not self.policy.allows(restarts) or not self._has_checkpoint():
            return False
        decision = requeue_after_failure(self.run_dir, self.job_id, restarts, self.shape)
        if decision.added and decision.schedulable:
            print(f"job {self.job_id} failed on a bad node: {decision.message}; requeued",
                  flush=True)  # fmt: skip
            return True
        if decision.ignored:
            self.stopped = decision
        return False

    def _has_checkpoint(self) -> bool:
        return any((self.run_dir / "checkpoints").glob("step-*[0-9]"))
