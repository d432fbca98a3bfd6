"""The planner's ranking: the layouts the toolkit runs for a job (tensor-parallel degree
inside a node, pipeline stages and schedule, FSDP or HSDP replicate sizes, micro-batch x
accumulation, activation checkpointing, reshard_after_forward, the gradient sync per
micro-step, and on GPUs the memory options), those the performance model says fit, fastest
first (`plan_job`); the cost of training on each priced preset (`cost_rows`); a spread of
plans for a check (`spread`). `python -m toolkit.plan` (toolkit.plan) prints them, and the
GPU check (toolkit.measure.gpu_plans) runs its picks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from toolkit.config.hardware import HardwareConfig
from toolkit.config.job import JobConfig
from toolkit.config.model import TransformerConfig, display_name, max_seq_len
from toolkit.config.shape import global_batch_size, tasks_per_node, world_size
from toolkit.perfmodel import Layout, Prediction, predict
from toolkit.perfmodel.counted_model import CountedShape
from toolkit.perfmodel.job import fused_optimizer

MAX_TP = 8  # tensor parallelism beyond one NVLink domain of 8 GPUs is not worth enumerating
MAX_PP = 16
PP_SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2))
DEFAULT_KERNELS = "torch"
DEFAULT_OPTIMIZER = "adamw"
# The memory options the planner may enumerate on GPUs (first = the default).
KERNEL_OPTIONS = (DEFAULT_KERNELS, "liger")
OPTIMIZER_OPTIONS = (DEFAULT_OPTIMIZER, "adamw8bit")
P = TypeVar("P")


@dataclass(frozen=True)
class Plan:
    layout: Layout
    prediction: Prediction

    def overrides(self) -> list[str]:
        lay = self.layout
        out = [
            f"trainer.micro_batch_size={lay.micro_batch_size}",
            f"trainer.grad_accum={lay.grad_accum}",
            f"parallel.tp={lay.tp}",
            f"parallel.pp={lay.pp}",
            f"parallel.dp_replicate={lay.replicate}",
            f"parallel.dp_shard={lay.shard_size}",
        ]
        if lay.pp > 1:
            out.append(f"parallel.pp_schedule={lay.pp_schedule}")
            if lay.pp_schedule == "interleaved_1f1b":
                out.append(f"parallel.pp_virtual_stages={lay.pp_virtual_stages}")
        out += [
            f"parallel.activation_checkpointing={str(lay.activation_checkpointing).lower()}",
            f"parallel.reshard_after_forward={str(lay.reshard_after_forward).lower()}",
        ]
        if lay.grad_accum > 1 and lay.pp == 1:
            out += [
                f"trainer.grad_sync={lay.grad_sync}",
                "trainer.reshard_between_micro_steps="
                + str(lay.reshard_between_micro_steps).lower(),
            ]
        if lay.kernels != DEFAULT_KERNELS:
            out.append(f"model.kernels={lay.kernels}")
        if lay.optimizer != DEFAULT_OPTIMIZER:
            out.append(f"optim={lay.optimizer}")  # the optimizer's preset, conf/optim/NAME.yaml
        return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_degrees(model: TransformerConfig | CountedShape | None, ranks_per_node: int) -> list[int]:
    """Tensor-parallel degrees: inside a node (divisors of its ranks, at most 8), splitting
    the heads and the MLP width evenly (parallel.problems refuses the others)."""
    if not isinstance(model, TransformerConfig) or not model.SUPPORTS.tensor_parallel:
        return [1]  # a model without a tensor-parallel plan runs tp=1 only
    hidden = int(model.dim * model.mlp_ratio)
    return [
        t
        for t in divisors(ranks_per_node)
        if t <= MAX_TP and model.num_heads % t == 0 and hidden % t == 0
    ]


def pp_options(
    model: TransformerConfig | CountedShape | None, ranks: int
) -> list[tuple[int, str, int]]:
    """(stages, schedule, virtual stages): stages dividing the layers and the ranks left by
    tp (balanced stages of whole layers), each schedule; interleaved with 2 virtual stages
    where the layers divide into 2 x stages."""
    found = [(1, "1f1b", 1)]
    if not isinstance(model, TransformerConfig) or not model.SUPPORTS.pipeline:
        return found  # no pipeline split: one stage
    for pp in divisors(ranks):
        if pp == 1 or pp > MAX_PP or model.num_layers % pp:
            continue
        for schedule, v in PP_SCHEDULES:
            if model.num_layers % (pp * v) == 0:
                found.append((pp, schedule, v))
    return found


def memory_option_pairs(
    tp: int, model: TransformerConfig | None, kernels: tuple[str, ...], optimizers: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(model.kernels, optim.name) pairs for one layout, the default first: Liger's fused
    loss only without tensor parallelism (it needs the whole vocabulary on the rank) and
    only on the GPT (the time-series model's loss is not a cross-entropy)."""
    gpt = model is None or getattr(model, "token_inputs", False)
    usable = [k for k in kernels if k == DEFAULT_KERNELS or (tp == 1 and gpt)]
    return [(k, o) for k in usable for o in optimizers]


def layouts(
    base: Layout,
    global_batch: int,
    model: TransformerConfig | None = None,
    kernels: tuple[str, ...] | None = None,
    optimizers: tuple[str, ...] | None = None,
) -> list[Layout]:
    """Every layout of `global_batch` sequences on base.world_size ranks: tensor-parallel
    degree and pipeline stages/schedule (when `model` is given), replicate groups,
    micro-batch x accumulation (a 1F1B pipeline needs at least as many micro-batches as
    stages), activation checkpointing and reshard_after_forward; each with every memory
    option of `kernels` x `optimizers` that applies (None: the base layout's own)."""
    kernels = (base.kernels,) if kernels is None else kernels
    optimizers = (base.optimizer,) if optimizers is None else optimizers
    world = base.world_size
    found = []
    for tp in tp_degrees(model, base.ranks_per_node):
        for pp, schedule, v in pp_options(model, world // tp):
            dp = world // (tp * pp)
            if world % (tp * pp) or global_batch % dp:
                continue
            per_rank = global_batch // dp
            for replicate in divisors(dp):
                for accum in divisors(per_rank):
                    if pp > 1 and schedule != "gpipe" and accum < pp * v:
                        continue
                    for ac in (False, True):
                        for reshard in (True, False):
                            for sync, between in micro_step_options(pp, accum):
                                for kernel, optimizer in memory_option_pairs(
                                    tp, model, kernels, optimizers
                                ):
                                    found.append(
                                        dataclasses.replace(
                                            base,
                                            tp=tp,
                                            pp=pp,
                                            pp_schedule=schedule,
                                            pp_virtual_stages=v,
                                            replicate=replicate,
                                            micro_batch_size=per_rank // accum,
                                            grad_accum=accum,
                                            activation_checkpointing=ac,
                                            reshard_after_forward=reshard,
                                            grad_sync=sync,
                                            reshard_between_micro_steps=between,
                                            kernels=kernel,
                                            optimizer=optimizer,
                                        )
                                    )
    return found


def micro_step_options(pp: int, accum: int) -> list[tuple[str, bool]]:
    """(trainer.grad_sync, trainer.reshard_between_micro_steps) for one layout, today's
    first: both of each with accumulation; one micro-step has nothing between micro-steps;
    a pipeline's stages reduce after the last micro-batch and stay gathered in between
    (torch's PipelineStage decides)."""
    if pp > 1:
        return [("last", False)]
    if accum == 1:
        return [("every", True)]
    return [(sync, between) for sync in ("last", "every") for between in (True, False)]


def rank_plans(
    model: TransformerConfig,
    base: Layout,
    hw: HardwareConfig,
    global_batch: int,
    kernels: tuple[str, ...] | None = None,
    optimizers: tuple[str, ...] | None = None,
) -> tuple[list[Plan], int]:
    """(plans that fit, fastest first; how many did not fit). The sort is stable and the
    default memory options are enumerated first, so they win ties."""
    plans = [
        Plan(lay, predict(model, lay, hw))
        for lay in layouts(base, global_batch, model, kernels, optimizers)
    ]
    fitting = [p for p in plans if p.prediction.fits]
    fitting.sort(key=lambda p: -p.prediction.tokens_per_s)
    return fitting, len(plans) - len(fitting)


def memory_options(job: JobConfig) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
    """(kernels, optimizers) the planner enumerates for `job`, and one line per option left
    out with the reason. Both need a GPU (Liger's kernels are Triton; on CPU they only run
    interpreted, for tests) and their code: the Liger wrapper module, the optimizer's
    preset conf/optim/NAME.yaml and torchao."""
    from toolkit.config.compose import group_options
    from toolkit.kernels.backend import importable

    kernels, optimizers = [getattr(job.model, "kernels", "torch")], [job.optim.name]
    skipped = []
    if job.cluster.gpus_per_node < 1:
        return tuple(kernels), tuple(optimizers), ["memory options: GPU jobs only"]
    if not getattr(job.model, "token_inputs", False):
        skipped.append("model.kernels=liger: the GPT's loss only")
    elif not (importable("toolkit.kernels.liger") and importable("liger_kernel")):
        skipped.append("model.kernels=liger: toolkit.kernels.liger or liger_kernel missing")
    else:
        kernels = list(dict.fromkeys([*KERNEL_OPTIONS, getattr(job.model, "kernels", "torch")]))
    if "adamw8bit" not in group_options("optim") or not importable("torchao"):
        skipped.append("optim=adamw8bit: conf/optim/adamw8bit.yaml or torchao missing")
    else:
        optimizers = list(dict.fromkeys([*OPTIMIZER_OPTIONS, job.optim.name]))
    return tuple(kernels), tuple(optimizers), [f"not enumerated: {line}" for line in skipped]


def base_layout(job: JobConfig, seq_len: int | None = None) -> Layout:
    """The layout every plan varies: the cluster's ranks, the job's precision and memory
    options, `seq_len` tokens per sequence (None: data.seq_len)."""
    ranks_per_node = job.cluster.gpus_per_node or tasks_per_node(job.cluster)
    return Layout(
        world_size=job.cluster.nodes * ranks_per_node,
        ranks_per_node=ranks_per_node,
        micro_batch_size=1,
        grad_accum=1,
        seq_len=job.data.seq_len if seq_len is None else seq_len,
        param_dtype=job.precision.param_dtype,
        reduce_dtype=job.precision.reduce_dtype,
        kernels=getattr(job.model, "kernels", "torch"),
        optimizer=job.optim.name,
        fused_optimizer=fused_optimizer(job),
    )


SHAPE_FIELDS = ("num_layers", "dim", "num_heads", "mlp_ratio", "vocab_size", "max_seq_len")


def planning_defaults(
    job: JobConfig, overrides: list[str], seq_len: int | None
) -> tuple[list[str], list[str]]:
    """Overrides to add to the user's so that the plan is for what a GPU user trains, and
    one line per default taken: bf16 on a GPU preset unless precision= is given; the
    model's max_seq_len tokens per sequence unless data.seq_len= or --seq-len is given
    (data.seq_len's preset default is a CPU test's)."""
    added, said = [], []
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    # A GPU preset: a device (no shared CPU cores) whose bf16 peak is above its fp32 one.
    hw = job.hardware
    gpu = hw.cores_per_node == 0 and hw.peak_flops_bf16 > hw.peak_flops_fp32
    if gpu and "precision" not in given:
        added.append("precision=bf16")
        said.append(
            f"precision: bf16 (a GPU preset, {job.hardware.name}; precision=NAME to choose)"
        )
    model_len = max_seq_len(job.model)
    if seq_len is not None:
        added.append(f"data.seq_len={seq_len}")
    elif "data.seq_len" not in given and model_len > 0 and model_len != job.data.seq_len:
        added.append(f"data.seq_len={model_len}")
        said.append(
            f"sequence length: {model_len}, the model's max_seq_len (--seq-len N or "
            "data.seq_len=N to choose)"
        )
    return added, said


def shape_name(job: JobConfig, overrides: list[str]) -> str:
    """The model's name, with the shape overrides that changed it."""
    changed = [
        o.split("=", 1)[0].removeprefix("model.") + "=" + o.split("=", 1)[1]
        for o in overrides
        if "=" in o
        and o.split("=", 1)[0].removeprefix("model.") in SHAPE_FIELDS
        and o.startswith("model.")
    ]
    name = display_name(job.model)
    return f"{name} (overridden: {', '.join(changed)})" if changed else name


def batch_line(job: JobConfig, world: int, batch: int, seq_len: int) -> str:
    """The global batch planned for and where it comes from."""
    t = job.trainer
    source = (
        "trainer.global_batch_size"
        if t.global_batch_size
        else f"trainer.micro_batch_size x grad_accum x ranks = {t.micro_batch_size} x "
        f"{t.grad_accum} x {world}; trainer.global_batch_size=N to choose"
    )
    return (
        f"planned for a global batch of {batch} sequences x {seq_len} tokens = "
        f"{batch * seq_len:,} tokens per step ({source})"
    )


def job_global_batch(job: JobConfig, world: int) -> int:
    return job.trainer.global_batch_size or global_batch_size(job.trainer, world)


def cost_rows(
    model: TransformerConfig,
    base: Layout,
    global_batch: int,
    presets: dict[str, HardwareConfig],
    prices: dict[str, float],
    amount: float,
    kernels: tuple[str, ...] | None = None,
    optimizers: tuple[str, ...] | None = None,
) -> list[dict[str, object]]:
    """Per priced preset: the best layout's rate, hours and cost to train `amount` in the
    model's unit (tokens for a token model, samples for a samples model; the row's "unit"
    says which, its "tokens_per_s" or "samples_per_s" the rate); cheapest first, presets
    where nothing fits last."""
    from toolkit.perfmodel.count_job import predicted_rate

    rows: list[dict[str, object]] = []
    for name, price in prices.items():
        plans, _ = rank_plans(model, base, presets[name], global_batch, kernels, optimizers)
        if not plans:
            rows.append({"hardware": name, "fits": False})
            continue
        best = plans[0]
        unit, rate = predicted_rate(best.prediction, model, base.seq_len)
        hours = amount / rate / 3600.0
        rows.append(
            {
                "hardware": name,
                "fits": True,
                "unit": unit,
                f"{unit}_per_s": rate,
                "hours": hours,
                "device_hours": hours * base.world_size,
                "cost": hours * base.world_size * price,
                "overrides": best.overrides(),
            }
        )
    rows.sort(key=lambda r: (not r["fits"], r.get("cost", 0.0)))
    return rows


@dataclass(frozen=True)
class Planning:
    """A job's layouts ranked as `python -m toolkit.plan` ranks them."""

    job: JobConfig
    overrides: list[str]  # the given ones and the defaults taken: what the plans are for
    defaults: list[str]  # one line per default taken, for the user
    model: TransformerConfig | CountedShape
    base: Layout
    batch: int
    kernels: tuple[str, ...] | None  # the memory options enumerated (None: the job's own)
    optimizers: tuple[str, ...] | None
    skipped: list[str]  # one line per memory option left out, with the reason
    plans: list[Plan]  # those that fit, fastest first
    dropped: int  # how many did not fit


def plan_job(
    given: list[str],
    config_dirs: list[str] | None = None,
    seq_len: int | None = None,
    with_memory_options: bool = True,
) -> Planning | None:
    """Compose the job, take the planning defaults (planning_defaults), and rank its layouts;
    None after printing each config problem as one `error:` line (job_or_none).
    `with_memory_options=False` ranks the job's own kernels and optimizer only."""
    from toolkit.config.compose import job_or_none
    from toolkit.perfmodel.count_job import perf_model

    dirs = config_dirs or []
    job = job_or_none(given, dirs)
    if job is None:
        return None
    added, defaults = planning_defaults(job, given, seq_len)
    overrides = [*given, *added]
    job = job_or_none(overrides, dirs) if added else job
    if job is None:
        return None
    base = base_layout(job)
    batch = job_global_batch(job, world_size(job.cluster))
    kernels, optimizers, skipped = memory_options(job) if with_memory_options else (None, None, [])
    model = perf_model(job)  # the built-in shape, or your model's counted costs
    plans, dropped = rank_plans(model, base, job.hardware, batch, kernels, optimizers)
    return Planning(
        job, overrides, defaults, model, base, batch, kernels, optimizers, skipped, plans, dropped
    )


def spread(plans: list[P], k: int) -> list[P]:
    """k plans spread over the ranking (the best, the worst and evenly between): their
    predicted differences are large enough for a short run on a noisy machine to tell
    whether the order holds, unlike the top k, which often lie within a few per cent."""
    if k >= len(plans):
        return list(plans)
    if k == 1:
        return plans[:1]
    return [plans[round(i * (len(plans) - 1) / (k - 1))] for i in range(k)]
