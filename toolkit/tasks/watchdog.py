"""The node agent's hang watchdog settings for a rank (toolkit.telemetry.spec.WatchdogSpec),
from the job: shared by task=train (toolkit.tasks.train_hooks) and the script task, which
imports this light module rather than the training task's hooks (DTensor, the models, ...)."""

from __future__ import annotations

from toolkit.config.job import JobConfig
from toolkit.distributed.env import DistEnv
from toolkit.telemetry.spec import WatchdogSpec


def watchdog_spec(job: JobConfig, env: DistEnv) -> WatchdogSpec | None:
    """The node agent's hang watchdog settings (None: fault.hang_watchdog=false)."""
    if not job.fault.hang_watchdog:
        return None
    from toolkit.executors import after_hang
    from toolkit.executors.preemption import slurm_job_id
    from toolkit.executors.requeue import RequeuePolicy

    policy = RequeuePolicy.of(job)  # crosses to the after-hang action field by field
    return WatchdogSpec(
        timeout_s=job.fault.hang_timeout_s,
        startup_timeout_s=job.fault.hang_startup_timeout_s,
        requeue=job.checkpoint.enabled and policy.requeue,
        max_restarts=policy.max_restarts,
        slurm_job_id=slurm_job_id(env.source),
        nodes=policy.shape.nodes,
        exclude=policy.shape.exclude,
        partition=policy.shape.partition,
        exclude_nodes=policy.shape.enabled,
        after_hang_module=after_hang.__name__,
    )
