"""Validation at the edge: every problem found at once, each as one actionable line.

Runs in the launcher before any rank starts. Components may add their own checks by
registering a function in VALIDATORS (it returns a list of problem lines).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from toolkit.config.checkpoint import validate_checkpoint
from toolkit.config.cluster import ClusterConfig, slurm_problems
from toolkit.config.data import DataConfig
from toolkit.config.errors import ConfigError, below_minimum
from toolkit.config.job import JobConfig
from toolkit.config.model import ModelConfig
from toolkit.config.precision import PrecisionConfig

Validator = Callable[[JobConfig, int], list[str]]
VALIDATORS: list[Validator] = [lambda job, world: validate_checkpoint(job.checkpoint)]


def local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch / broken driver: behave as CPU-only
        return 0


def tasks_per_node(cluster: ClusterConfig) -> int:
    """Resolved ranks per node (None means one per GPU, else 2 locally / 1 on Slurm)."""
    if cluster.tasks_per_node is not None:
        return cluster.tasks_per_node
    if cluster.kind == "slurm":
        return cluster.gpus_per_node or 1
    return local_gpu_count() or 2


def world_size(cluster: ClusterConfig) -> int:
    return cluster.nodes * tasks_per_node(cluster)


def micro_batch_size(job: JobConfig, world: int) -> int:
    """Sequences per rank per micro-step (global_batch_size, when set, decides)."""
    t = job.trainer
    if t.global_batch_size is None:
        return t.micro_batch_size
    return t.global_batch_size // (world * t.grad_accum)


def global_batch_size(job: JobConfig, world: int) -> int:
    return micro_batch_size(job, world) * job.trainer.grad_accum * world


def _cluster(c: ClusterConfig) -> list[str]:
    p = []
    if c.kind not in ClusterConfig.KINDS:
        p.append(
            f"cluster.kind={c.kind}: unknown executor; allowed: {', '.join(ClusterConfig.KINDS)}"
        )
    if c.tasks_per_node is not None and c.tasks_per_node < 1:
        p.append(
            f"cluster.tasks_per_node={c.tasks_per_node}: must be >= 1 (or null for one per GPU)"
        )
    p += below_minimum(
        "cluster", c, {"nodes": 1, "gpus_per_node": 0, "array_parallelism": 1, "signal_lead_s": 0}
    )
    if c.kind == "local" and c.nodes != 1:
        p.append(
            f"cluster.nodes={c.nodes}: cluster=local runs on this machine only; use 1, or cluster=slurm"
        )
    if c.kind == "slurm":
        p += slurm_problems(c)
    return p


def _model(m: ModelConfig, d: DataConfig) -> list[str]:
    p = []
    if m.kind not in ModelConfig.KINDS:
        p.append(
            f"model.kind={m.kind}: unknown model kind; allowed: {', '.join(ModelConfig.KINDS)}"
        )
    p += below_minimum(
        "model", m, dict.fromkeys(("num_layers", "dim", "num_heads", "max_seq_len"), 1)
    )
    if m.num_heads >= 1 and m.dim % m.num_heads:
        p.append(f"model.dim={m.dim}: must be divisible by model.num_heads={m.num_heads}")
    if d.seq_len > m.max_seq_len:
        p.append(
            f"data.seq_len={d.seq_len}: above the model's maximum sequence length "
            f"(model.max_seq_len={m.max_seq_len}); use data.seq_len<={m.max_seq_len}"
        )
    p += below_minimum("data", d, {"seq_len": 2})
    if d.kind not in DataConfig.KINDS:
        p.append(f"data.kind={d.kind}: unknown; allowed: {', '.join(DataConfig.KINDS)}")
    if m.kind == "gpt" and d.kind == "returns":
        p.append("data=returns: feeds real-valued series; use model=ts_transformer (or data=text)")
    if m.kind == "timeseries" and d.kind != "returns":
        p.append(f"data={d.kind}: model=ts_transformer needs data=returns")
    if m.kind == "timeseries" and m.num_series < 1:
        p.append(f"model.num_series={m.num_series}: must be >= 1 for the time-series model")
    if m.kind == "gpt" and d.kind in ("text", "synthetic") and m.vocab_size < 256:
        p.append(f"model.vocab_size={m.vocab_size}: byte-level data needs >= 256")
    if not 0.0 < d.val_fraction < 0.5:
        p.append(f"data.val_fraction={d.val_fraction}: must be in (0, 0.5)")
    return p


def _precision(pr: PrecisionConfig) -> list[str]:
    return [
        f"precision.{name}={getattr(pr, name)}: unknown dtype; allowed: {', '.join(PrecisionConfig.DTYPES)}"
        for name in ("param_dtype", "reduce_dtype")
        if getattr(pr, name) not in PrecisionConfig.DTYPES
    ]


def _batch(job: JobConfig, world: int) -> list[str]:
    t = job.trainer
    p = below_minimum("trainer", t, {"steps": 1, "grad_accum": 1})
    if t.grad_accum < 1:
        return p
    if t.global_batch_size is not None:
        unit = world * t.grad_accum
        if t.global_batch_size < unit or t.global_batch_size % unit:
            p.append(
                f"trainer.global_batch_size={t.global_batch_size}: must be a positive multiple of "
                f"world size x grad_accum = {world} x {t.grad_accum} = {unit}"
            )
    else:
        p += below_minimum("trainer", t, {"micro_batch_size": 1})
    par = job.parallel
    if par.replicate < 1 or world % par.replicate:
        p.append(
            f"parallel.replicate={par.replicate}: must divide the world size {world} "
            "(HSDP shards within world/replicate ranks)"
        )
    p += below_minimum("optim", job.optim, {"warmup_steps": 0})
    if job.optim.lr <= 0:
        p.append(f"optim.lr={job.optim.lr}: must be > 0")
    return p


def validate(job: JobConfig) -> None:
    """Raise ConfigError listing every problem; warn about settings that will be ignored."""
    problems = _cluster(job.cluster) + _model(job.model, job.data) + _precision(job.precision)
    if not any(pr.startswith("cluster.") for pr in problems):
        world = world_size(job.cluster)
        problems += _batch(job, world)
        for check in VALIDATORS:
            problems += check(job, world)
    from toolkit.entrypoint import TASKS  # late: the task table imports heavy modules lazily

    if job.task not in TASKS:
        problems.append(f"task={job.task}: unknown task; allowed: {', '.join(sorted(TASKS))}")
    if problems:
        raise ConfigError(problems)
    if job.cluster.kind == "local" and (job.cluster.partition or job.cluster.account):
        warnings.warn("cluster.partition/account are ignored by cluster=local", stacklevel=2)
    if job.cluster.kind == "slurm" and job.task == "train" and not job.checkpoint.enabled:
        warnings.warn(
            "checkpoint.enabled=false on Slurm: a preemption or time limit loses the whole run; "
            "use checkpoint=periodic",
            stacklevel=2,
        )


# Component checks (each module owns its own; imported last to avoid import cycles).
from toolkit.config.collectives import collectives_problems  # noqa: E402
from toolkit.nccl.checks import check_job as _check_nccl  # noqa: E402

VALIDATORS.append(_check_nccl)
VALIDATORS.append(lambda job, world: collectives_problems(job.collectives, world))
