"""From the typed cluster config to submitit's sbatch parameters and script (no side effects).

submitit writes the script (`submitit.slurm.slurm._make_sbatch_string`: typed, validated
parameters; its one private function used here, feature-checked by `sbatch_writer`); the
launcher submits it with `sbatch` itself (toolkit.slurm_cli.sbatch). docs/slurm.md says why
submitit's executor does not submit it.

Every task of the job runs the same in-job entrypoint as the local executor,
`python -u -m toolkit.entrypoint RUN_DIR`, under one `srun`. For a sweep (a job array)
RUN_DIR is `<folder>/runs/$SLURM_ARRAY_TASK_ID`, a symlink to the element's run dir.
"""

from __future__ import annotations

import inspect
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
import submitit.slurm.slurm

from toolkit.config.cluster import ClusterConfig, parse_sbatch_extra
from toolkit.config.errors import ConfigError
from toolkit.config.shape import tasks_per_node

# One rank failing ends the step at once instead of leaving the others in a collective.
SRUN_ARGS = ["--kill-on-bad-exit=1"]
# Ranks must find their place from SLURM_*, not from torchrun variables of the submitting shell.
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TOOLKIT_JOB_ID",
)


@dataclass(frozen=True)
class Submission:
    """Everything that decides the sbatch script of one job or one job array."""

    folder: Path  # submitit's folder: sbatch script and per-task logs
    command: str  # what srun runs in every task
    parameters: dict[str, Any]  # submitit SlurmExecutor parameters
    num_runs: int  # 1: one job; more: one array element per run

    def script(self) -> str:
        """The exact sbatch script submitit writes for this submission."""
        map_count = self.num_runs if self.num_runs > 1 else None
        write = sbatch_writer(self.parameters)
        return write(
            command=self.command, folder=self.folder, map_count=map_count, **self.parameters
        )


def sbatch_writer(parameters: dict[str, Any]) -> Callable[..., str]:
    """submitit's sbatch script writer, once it is known to take every parameter given
    (it is private to submitit: a submitit without it, or with other parameters, is refused
    in one line instead of failing inside it)."""
    write = getattr(submitit.slurm.slurm, "_make_sbatch_string", None)
    version = getattr(submitit, "__version__", "?")
    if write is None:
        raise ConfigError(
            f"submitit {version} has no submitit.slurm.slurm._make_sbatch_string, the sbatch "
            "script writer this toolkit uses; install submitit>=1.5,<2"
        )
    accepted = set(inspect.signature(write).parameters)
    unknown = sorted({"command", "folder", "map_count", *parameters} - accepted)
    if unknown:
        raise ConfigError(
            f"submitit {version}'s sbatch writer takes no {', '.join(unknown)}; "
            "install submitit>=1.5,<2"
        )
    return write


def setup_lines(c: ClusterConfig, repo_root: Path) -> list[str]:
    lines = [
        f"unset {' '.join(TORCHRUN_VARS)}",
        f"export PYTHONPATH={shlex.quote(str(repo_root))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONUNBUFFERED=1",
    ]
    if c.master_port is not None:
        lines.append(f"export MASTER_PORT={c.master_port}")
    return lines + list(c.setup)


def parameters(c: ClusterConfig, repo_root: Path) -> dict[str, Any]:
    """submitit SlurmExecutor parameters mirroring the sbatch options of the config."""
    extra: dict[str, Any] = {
        # submitit hard-codes USR2; the config names the signal.
        "signal": f"{c.signal}@{c.signal_lead_s}",
        "requeue" if c.requeue else "no_requeue": True,
    }
    extra.update(parse_sbatch_extra(c.sbatch_extra))
    return {
        "job_name": c.job_name,
        "nodes": c.nodes,
        "ntasks_per_node": tasks_per_node(c),
        "gpus_per_node": c.gpus_per_node or None,
        "cpus_per_task": c.cpus_per_task,
        "mem": c.mem,
        "time": c.time,
        "partition": c.partition,
        "account": c.account,
        "qos": c.qos,
        "constraint": c.constraint,
        "exclude": c.exclude,
        "exclusive": True if c.exclusive else None,
        "signal_delay_s": c.signal_lead_s,
        "array_parallelism": c.array_parallelism,
        "wckey": None,  # submitit's default "submitit" fails where wckeys are enforced
        "setup": setup_lines(c, repo_root),
        "srun_args": [*SRUN_ARGS, *c.srun_extra],
        "additional_parameters": extra,
    }


def entrypoint_command(c: ClusterConfig, run_dir_arg: str) -> str:
    python = shlex.quote(c.python or sys.executable)
    return f"{python} -u -m toolkit.entrypoint {run_dir_arg}"


def plan(cluster: ClusterConfig, run_dirs: list[Path], repo_root: Path) -> Submission:
    """One job for one run dir; one array over `<sweep>/slurm/runs/<i>` for several."""
    if len(run_dirs) == 1:
        folder = run_dirs[0] / "slurm"
        run_dir_arg = shlex.quote(str(run_dirs[0]))
    else:
        folder = Path(_common_parent(run_dirs)) / "slurm"
        run_dir_arg = shlex.quote(str(folder / "runs")) + '/"$SLURM_ARRAY_TASK_ID"'
    return Submission(
        folder=folder,
        command=entrypoint_command(cluster, run_dir_arg),
        parameters=parameters(cluster, repo_root),
        num_runs=len(run_dirs),
    )


def _common_parent(run_dirs: list[Path]) -> Path:
    parents = {p.parent for p in run_dirs}
    return parents.pop() if len(parents) == 1 else run_dirs[0].parent


def log_path(folder: Path, job_id: str, rank: int | str, stream: str) -> Path:
    """submitit's per-task log: `<folder>/<job>_<rank>_log.out|err` (job '120_3' in arrays)."""
    return folder / f"{job_id}_{rank}_log.{stream}"
