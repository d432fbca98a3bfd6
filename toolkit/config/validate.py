"""Validation at the edge: every problem found at once, each as one actionable line.

Runs in the launcher before any rank starts. Each group's module exports one
`problems(cfg, ...) -> list[str]`, listed below in one place; checks that need the runtime
(task names, NCCL variables against what NCCL knows) are passed in by the launcher, so this
package imports nothing outside `toolkit.config`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from toolkit.config import (
    checkpoint,
    cluster,
    collectives,
    data,
    fault,
    hardware,
    launch,
    model,
    nccl,
    optim,
    parallel,
    precision,
    script,
    telemetry,
    tracking,
    trainer,
)
from toolkit.config.errors import ConfigError
from toolkit.config.job import JobConfig
from toolkit.config.shape import world_size

# A check that needs more than the config: (job, world size) -> problem lines.
RuntimeCheck = Callable[[JobConfig, int], list[str]]


def problems(job: JobConfig, runtime_checks: Sequence[RuntimeCheck] = ()) -> list[str]:
    """Every problem with the job, one line each; [] when it can run."""
    found = cluster.problems(job.cluster)
    shape_known = not found  # the world size needs a valid cluster group
    found += model.problems(job.model)
    found += data.problems(job.data, job.model)
    found += precision.problems(job.precision)
    found += optim.problems(job.optim)
    found += checkpoint.problems(job.checkpoint)
    found += telemetry.problems(job.telemetry)
    found += fault.problems(job.fault)
    found += tracking.problems(job.tracking)
    found += hardware.problems(job.hardware)
    found += launch.problems(job.launch)
    found += script.problems(job.script)
    found += nccl.problems(job.nccl, job.cluster.nodes)
    if shape_known:
        world = world_size(job.cluster)
        mesh = parallel.mesh_shape(job.parallel, world)
        # The batch is split over the data-parallel ranks only (tp and pp peers share theirs).
        found += trainer.problems(job.trainer, mesh.dp if not isinstance(mesh, str) else world)
        found += trainer.ensemble_problems(job.trainer, job.parallel, job.optim)
        found += parallel.problems(
            job.parallel, world, job.model, job.trainer.grad_accum, job.data.seq_len
        )
        found += collectives.problems(job.collectives, world)
        for check in runtime_checks:
            found += check(job, world)
    return found


def validate(job: JobConfig, runtime_checks: Sequence[RuntimeCheck] = ()) -> None:
    """Raise ConfigError listing every problem; warn about settings that will be ignored."""
    found = problems(job, runtime_checks)
    if found:
        raise ConfigError(found)
    if job.cluster.kind == "local" and (job.cluster.partition or job.cluster.account):
        warnings.warn("cluster.partition/account are ignored by cluster=local", stacklevel=2)
    if job.trainer.on_nonfinite == "rollback" and not job.checkpoint.enabled:
        warnings.warn(
            "trainer.on_nonfinite=rollback with checkpoint.enabled=false: there is nothing to "
            "roll back to, a non-finite step stops the run as stop does; use checkpoint=periodic",
            stacklevel=2,
        )
    if (
        job.cluster.kind == "slurm"
        and job.task == "train"
        and not job.script.enabled
        and not job.checkpoint.enabled
    ):
        warnings.warn(
            "checkpoint.enabled=false on Slurm: a preemption or time limit loses the whole run; "
            "use checkpoint=periodic",
            stacklevel=2,
        )
