"""When a Slurm job may be requeued, and what it may leave out: one policy, built once from
the job's config (`RequeuePolicy.of`), used by every path that requeues a job: the
preemption hook (toolkit.executors.preemption), the after-hang action
(toolkit.executors.after_hang), the launcher's watch of a job that failed on a bad node
(toolkit.executors.slurm_exclude.RequeueWatch) and the script task (toolkit.tasks.script).

A restart is one requeue of the job: Slurm's restart count (SLURM_RESTART_COUNT in the job,
scontrol's Restarts outside it) is the number of attempts before this one. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkit.distributed.env import restart_count


@dataclass(frozen=True)
class JobShape:
    """What the exclusion decision (toolkit.executors.exclusion.decide) needs of the job."""

    nodes: int  # cluster.nodes
    exclude: str | None = None  # cluster.exclude
    partition: str | None = None  # cluster.partition (None: the job's, from Slurm)
    enabled: bool = True  # fault.exclude_nodes: leave a bad node out at a requeue

    @classmethod
    def of(cls, job: Any) -> JobShape:
        """From a JobConfig."""
        c = job.cluster
        return cls(c.nodes, c.exclude, c.partition, job.fault.exclude_nodes)


@dataclass(frozen=True)
class RequeuePolicy:
    requeue: bool = True  # checkpoint.requeue
    max_restarts: int = 10  # checkpoint.max_restarts: requeues allowed, then stop for good
    shape: JobShape = field(default_factory=lambda: JobShape(nodes=1))

    @classmethod
    def of(cls, job: Any) -> RequeuePolicy:
        """From a JobConfig."""
        return cls(job.checkpoint.requeue, job.checkpoint.max_restarts, JobShape.of(job))

    @staticmethod
    def restarts() -> int:
        """How many times this job was requeued before the running attempt (in the job)."""
        return restart_count()

    def exhausted(self, restarts: int) -> bool:
        """No requeue is left after `restarts` of them."""
        return restarts >= self.max_restarts

    def allows(self, restarts: int) -> bool:
        """The job may be requeued once more after `restarts` requeues."""
        return self.requeue and not self.exhausted(restarts)

    def refusal(self, job_id: str, restarts: int) -> str | None:
        """Why job `job_id` is not requeued after `restarts` requeues, in words; None: it is."""
        if not self.requeue:
            return f"checkpoint.requeue=false: not requeueing job {job_id}"
        if self.exhausted(restarts):
            return (
                f"job {job_id} restarted {restarts} times "
                f"(checkpoint.max_restarts={self.max_restarts}): not requeueing"
            )
        return None
