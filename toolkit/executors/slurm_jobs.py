"""What the launcher makes of Slurm's answers: whether Slurm can take a job from here, and
which task of a failed job failed first. The commands themselves: toolkit.slurm_cli."""

from __future__ import annotations

import os
import re
import shutil

from toolkit import slurm_cli

HOW_TO_POINT = (
    "point SLURM_CONF at your cluster's slurm.conf (or run on a login node), or start the "
    'local dev cluster: scripts/dev-cluster up && eval "$(scripts/dev-cluster env)"'
)


def unreachable_reason(timeout_s: float = 20) -> str | None:
    """Why Slurm cannot take a job from here, as one line, or None when it can."""
    if shutil.which("sbatch") is None:
        return f"cluster=slurm: no `sbatch` on PATH; {HOW_TO_POINT}"
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "the default slurm.conf"
    if conf and not os.path.isfile(conf):
        return f"cluster=slurm: {where} does not exist; {HOW_TO_POINT}"
    try:
        why = slurm_cli.ping(timeout_s)
    except slurm_cli.SlurmCommandError as exc:
        return f"cluster=slurm: slurmctld did not answer ({where}): {exc}; {HOW_TO_POINT}"
    if why is not None:
        return f"cluster=slurm: slurmctld is not reachable ({where}): {why}; {HOW_TO_POINT}"
    return None


def failed_task(batch_stderr: str) -> int | None:
    """The first task srun reported as failed ("srun: error: n2: task 1: Exited ...")."""
    m = re.search(r"task (\d+): (?:Exited|Killed|Terminated|Segmentation|Aborted)", batch_stderr)
    return int(m.group(1)) if m else None
