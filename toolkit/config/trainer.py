"""The training loop's own knobs."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from toolkit.config.errors import below_minimum, not_one_of
from toolkit.config.targets import IMPORT_PATH, TARGET

GRAD_SYNC_MODES = ("auto", "every", "last")


@dataclass
class TrainerConfig:
    steps: int = 300
    micro_batch_size: int = 8  # sequences per rank per micro-step
    grad_accum: int = 1
    # Sequences per optimizer step over all ranks. None: micro_batch_size * grad_accum * world.
    # When set, it wins: micro_batch_size becomes global / (world * grad_accum).
    global_batch_size: int | None = None
    log_every: int = 10
    eval_every: int = 0  # 0: evaluate only at the end
    eval_batches: int = 4
    # Stop early once the validation loss reaches this (time-to-target); None: run all steps.
    target_val_loss: float | None = None
    time_budget_s: float | None = None
    progress: bool = True  # rich progress bar on rank 0
    # Two runs with the same seed give bitwise-equal results (not only a resume): torch's
    # deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8 before CUDA starts, NCCL_ALGO=
    # Ring and NCCL_PROTO=Simple (toolkit.distributed.determinism; rank 0's first lines say
    # so). Costs step time on a GPU; docs/config.md, "Deterministic mode".
    deterministic: bool = False
    # Your own hooks (toolkit.hooks.Hook), built in every rank and called after the
    # toolkit's: [{_target_: mypkg.callbacks.MyCallback, arg: 1}], the other keys keyword
    # arguments. A callback's eval_metrics() go into each eval event and summary.json.
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    # FSDP2's gradient reduction across micro-steps when grad_accum > 1: "every" reduce-scatters
    # each micro-step (sharded gradients accumulate: least memory, accum x the reduce-scatter
    # traffic); "last" only on the last (every rank keeps the whole unsharded gradient in the
    # reduce dtype until then: one reduce-scatter); "auto": the faster of the two that fits,
    # as the performance model predicts it (toolkit.perfmodel.job.grad_sync_choice).
    grad_sync: str = "auto"
    # False: non-final micro-steps keep their parameters unsharded after backward
    # (FSDPModule.set_reshard_after_backward), saving the next forward's all-gathers for
    # the memory of the whole unsharded model. Only matters when grad_accum > 1.
    reshard_between_micro_steps: bool = True
    # A step whose loss or grad norm is NaN/inf (any rank) is never applied to the weights and
    # never checkpointed. stop: end the run there (exit 80, one line naming the step);
    # skip: leave the weights as they were and go on with the next batch; rollback: every
    # rank restores the newest committed checkpoint and goes on after the bad step's batch
    # (the steps since that checkpoint count as taken, their updates are discarded:
    # toolkit.train.nonfinite). Stops as stop does with no checkpoint to restore.
    on_nonfinite: str = "stop"
    # rollback: how many times one run (one attempt) may roll back; the next non-finite
    # step stops it as stop does.
    max_rollbacks: int = 3
    # K members of one architecture trained at once in each rank (toolkit.train.ensemble:
    # stacked parameters, torch.func.vmap over members, one AdamW over the stack). 1: a
    # plain run. Every member sees the same batches (the data order comes from data.order_seed,
    # or the job's seed); a member's own seed sets its initialisation and dropout.
    ensemble: int = 1
    # Per-member settings, [] or one dict per member: name, seed, lr, weight_decay,
    # warmup_steps, dropout (MEMBER_KEYS). A missing key takes the job's value; a missing
    # seed is seed + i, a missing name m<i> (zero-padded: m00..m31).
    members: list[dict[str, Any]] = field(default_factory=list)


# What a sweep may vary inside one pack (an ensemble): override key -> member key.
PACKABLE: dict[str, str] = {
    "seed": "seed",
    "optim.lr": "lr",
    "optim.weight_decay": "weight_decay",
    "optim.warmup_steps": "warmup_steps",
    "model.dropout": "dropout",
}
MEMBER_KEYS = ("name", *PACKABLE.values())
MEMBER_NAME = re.compile(r"[A-Za-z0-9._-]+")


NONFINITE_ACTIONS = ("stop", "skip", "rollback")


def problems(t: TrainerConfig, world: int) -> list[str]:
    """Problems with the trainer group for a job of `world` ranks, one line each."""
    p = below_minimum("trainer", t, {"steps": 1, "grad_accum": 1, "max_rollbacks": 0})
    p += not_one_of("trainer", t, {"on_nonfinite": NONFINITE_ACTIONS})
    budget = t.time_budget_s
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        p.append(f"trainer.time_budget_s={budget}: must be a positive number of seconds (or null)")
    if t.target_val_loss is not None and not math.isfinite(t.target_val_loss):
        p.append(f"trainer.target_val_loss={t.target_val_loss}: must be a finite number (or null)")
    p += not_one_of("trainer", t, {"grad_sync": GRAD_SYNC_MODES})
    if t.grad_accum < 1:
        return p
    if t.global_batch_size is not None:
        unit = world * t.grad_accum
        if t.global_batch_size < unit or t.global_batch_size % unit:
            p.append(
                f"trainer.global_batch_size={t.global_batch_size}: must be a positive multiple of "
                f"data-parallel ranks (the world size over tp x pp) x grad_accum = {world} x {t.grad_accum} = {unit}"
            )
    else:
        p += below_minimum("trainer", t, {"micro_batch_size": 1})
    return p + callback_problems(t.callbacks) + member_problems(t)


def member_names(k: int) -> list[str]:
    """The default member names of an ensemble of `k`: m0..m9, m00..m31 (zero-padded to the
    width of k - 1)."""
    width = len(str(max(k - 1, 0)))
    return [f"m{i:0{width}d}" for i in range(k)]


def member_problems(t: TrainerConfig) -> list[str]:
    """trainer.ensemble and trainer.members: K >= 1, K settings (or none) with known keys,
    values of the right type and unique names."""
    if t.ensemble < 1:
        return [f"trainer.ensemble={t.ensemble}: must be >= 1 (1: a plain run)"]
    members = t.members
    if not members:
        return []
    if len(members) != t.ensemble:
        return [
            f"trainer.members: {len(members)} entries for trainer.ensemble={t.ensemble}; give "
            "one per member, or none (each member then takes the job's settings and seed + i)"
        ]
    p: list[str] = []
    names: list[str] = []
    numbers = {"lr": float, "weight_decay": float, "dropout": float, "seed": int}
    numbers["warmup_steps"] = int
    for i, member in enumerate(members):
        where = f"trainer.members[{i}]"
        if not isinstance(member, dict):
            p.append(f"{where}={member!r}: must be a mapping of {', '.join(MEMBER_KEYS)}")
            continue
        unknown = sorted(set(member) - set(MEMBER_KEYS))
        if unknown:
            p.append(
                f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(MEMBER_KEYS)}"
            )
        name = member["name"] if "name" in member else member_names(t.ensemble)[i]
        if not isinstance(name, str) or not MEMBER_NAME.fullmatch(name):
            p.append(f"{where}.name={name!r}: must be letters, digits, '.', '_' or '-'")
        names.append(str(name))
        for key, kind in numbers.items():
            if key not in member:
                continue
            value = member[key]
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if kind is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            if not ok or (kind is float and not math.isfinite(value)):
                p.append(
                    f"{where}.{key}={value!r}: must be {'an integer' if kind is int else 'a finite number'}"
                )
            elif key != "seed" and value < 0:
                p.append(f"{where}.{key}={value}: must be >= 0")
            elif key == "dropout" and value >= 1:
                p.append(f"{where}.dropout={value}: must be below 1")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        p.append(
            f"trainer.members: name(s) {', '.join(repeated)} repeated; each member needs its own"
        )
    return p


def callback_problems(callbacks: list[dict[str, Any]]) -> list[str]:
    """Each callback names its class (or factory) by import path in `_target_`."""
    p = []
    for i, node in enumerate(callbacks):
        target = node.get(TARGET)  # a user's node: a missing _target_ is reported
        if not isinstance(target, str) or not IMPORT_PATH.fullmatch(target):
            p.append(
                f"trainer.callbacks[{i}]._target_={target!r}: not an import path; each "
                "callback is {_target_: module.Class, ...keyword arguments}, e.g. "
                "{_target_: mypkg.callbacks.MyCallback}"
            )
    return p


def ensemble_problems(t: TrainerConfig, parallel: Any, optim: Any) -> list[str]:
    """What an ensemble (trainer.ensemble > 1) cannot combine with: tensor or pipeline
    parallelism (each rank holds all K members whole; members meet data parallelism only),
    meta-device init, and optimizers other than the toolkit's fp32 AdamW (the one written
    on stacked tensors with per-member learning rates). trainer.members with ensemble 1
    (one member run alone) sets AdamW's settings, so it needs AdamW too."""
    k = t.ensemble
    name = getattr(optim, "name", None)
    p = []
    if name != "adamw" and (k > 1 or t.members):
        p.append(
            f"optim={name or getattr(optim, 'target', 'a _target_ optimizer')} with "
            f"trainer.ensemble={k}{' and trainer.members' if t.members else ''}: members "
            "train with the toolkit's "
            "AdamW (per-member lr, weight decay, warm-up); use optim=adamw"
            + (", or trainer.ensemble=1" if k > 1 else ", or no trainer.members")
        )
    if k <= 1:
        return p
    for axis in ("tp", "pp"):
        degree = getattr(parallel, axis)
        if degree > 1:
            p.append(
                f"parallel.{axis}={degree} with trainer.ensemble={k}: an ensemble keeps all "
                f"members whole in each rank and combines with data parallelism only; set "
                f"parallel.{axis}=1, or trainer.ensemble=1"
            )
    if parallel.meta_init:
        p.append(
            f"parallel.meta_init=true with trainer.ensemble={k}: members are built one by one "
            "on the host from their seeds; set parallel.meta_init=false, or trainer.ensemble=1"
        )
    return p
