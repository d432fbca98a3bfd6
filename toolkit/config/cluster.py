"""Where the job runs: local processes or a Slurm allocation (fields mirror sbatch)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClusterConfig:
    """Executor and resources. ``kind=local`` starts ranks as local processes;
    ``kind=slurm`` submits through submitit (the sbatch-like fields apply there)."""

    kind: str = "local"  # local | slurm
    nodes: int = 1
    # Ranks per node. None: one per GPU when GPUs are present, else 2 locally / 1 on Slurm.
    tasks_per_node: int | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None  # e.g. "64G"; None: the partition's default
    time: str = "01:00:00"  # sbatch --time
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    exclusive: bool = False
    requeue: bool = True
    signal: str = "USR2"  # sent signal_lead_s before the time limit
    signal_lead_s: int = 120
    job_name: str = "toolkit"
    sbatch_extra: list[str] = field(
        default_factory=list
    )  # extra "#SBATCH" lines, e.g. "--reservation=x"
    setup: list[str] = field(default_factory=list)  # shell lines run before srun (module load, ...)
    array_parallelism: int = 8  # cap on concurrently running array elements (multirun)
    master_port: int | None = None  # None: a free port locally, derived from the job id on Slurm

    KINDS = ("local", "slurm")
