"""Which runs of a `-m` sweep train together as one ensemble (`launch.pack=auto`): pure logic.

Two runs share a pack when their resolved job configs are equal once the packable settings
(`toolkit.config.trainer.PACKABLE`: seed, optim.lr, optim.weight_decay, optim.warmup_steps,
model.dropout) and the run directory are left out: same model shape, data, batch, steps,
cluster, precision. The pack then runs as one job with `trainer.ensemble=K` and one member
per run, each member keeping its run's own packable values. A run that differs in anything
else goes to another pack; a run that cannot be a member (another task, your own script,
an ensemble already) stays a run of its own. Every decision carries its reason, so the
launcher can say which run went where and why (`pack_table`).

Data order: every member of a pack sees the same batches, those of the pack's data.order_seed.
A sweep that leaves data.order_seed unset gets it set to the first packed run's seed when the
pack's seeds differ (`Pack.data_seed`), so member r<i> equals the plain run of its own
settings plus `data.order_seed=<that seed>` (`Pack.equals`; losses to 1e-5 relative,
docs/ensembles.md). Runs whose data.order_seed differs are never packed together (a different
data order: `apart_reason` says so).

Nothing here composes, writes or imports the runtime: toolkit.launch feeds it each run's
resolved config as plain data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from toolkit.config.job import JobConfig
from toolkit.config.trainer import ensemble_problems
from toolkit.redact import redact

MEMBER_PREFIX = "r"  # member names r00, r01, ...: the run's index in the sweep
LEFT_OUT = ("run_dir",)  # differs for every run of a sweep by construction
MAX_DIFFERENCES_SHOWN = 3
DATA_SEED = "data.order_seed"  # the data order every member of a pack shares
WHY = {DATA_SEED: "data.order_seed (another data order)"}  # why a difference splits packs
NOT_A_SETTING = ("launch.pack=", "hydra.")  # overrides that say nothing of what is trained


@dataclass(frozen=True)
class SweepRun:
    """One combination of the sweep: its index, its overrides and its resolved job config
    as plain data (toolkit.config.compose.job_to_dict)."""

    index: int
    overrides: list[str]
    config: dict[str, Any]
    alone: str = ""  # why it cannot be an ensemble member (not_packable); '' when it can


@dataclass
class Pack:
    """Runs trained together (one process; on Slurm one job or array element). `members`
    holds one member settings dict per run (trainer.members), empty for a run of its own;
    `reason` says why this pack is apart from the first one ('' for the first)."""

    runs: list[SweepRun]
    members: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    data_seed: int | None = None  # a packed pack's data order (data.order_seed or the seed)
    sets_data_seed: bool = False  # the packer sets data.order_seed (the sweep left it unset)
    data_seed_given: bool = False  # the sweep's runs set data.order_seed (equal in a pack)

    @property
    def packed(self) -> bool:
        return len(self.members) > 1

    def ensemble_overrides(self) -> list[str]:
        """What the pack's job adds to its first run's overrides."""
        if not self.packed:
            return []
        members = ",".join(
            "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in m.items()) + "}"
            for m in self.members
        )
        added = [f"trainer.ensemble={len(self.members)}", f"trainer.members=[{members}]"]
        if self.sets_data_seed:  # ++: a `_target_` dataset node has no data.order_seed key yet
            added.append(f"++{DATA_SEED}={self.data_seed}")
        return added

    def equals(self, run: SweepRun) -> str:
        """The plain run a packed run's member equals: its own settings (redacted) with the
        pack's data order, e.g. 'optim.lr=0.01 seed=2 data.order_seed=1'."""
        own = [o for o in redact(run.overrides) if not o.startswith(NOT_A_SETTING)]
        given = any(o.lstrip("+").startswith(f"{DATA_SEED}=") for o in own)
        return " ".join(own if given else [*own, f"{DATA_SEED}={self.data_seed}"])


def value_at(config: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key; KeyError when the config has no such key (a user's model
    without `dropout`)."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def without(config: dict[str, Any], dotted_keys: list[str]) -> dict[str, Any]:
    """A deep copy of `config` without the given dotted keys (missing ones ignored)."""
    out = json.loads(json.dumps(config, default=str))
    for dotted in dotted_keys:
        *parents, last = dotted.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def shape_of(config: dict[str, Any], packable: dict[str, str]) -> str:
    """What must be equal for two runs to share a pack, as one canonical string."""
    return json.dumps(without(config, [*packable, *LEFT_OUT]), sort_keys=True, default=str)


def differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configs, sorted."""
    found = []
    for key in sorted(set(a) | set(b)):
        name = f"{prefix}{key}"
        if key not in a or key not in b:
            found.append(name)
        elif isinstance(a[key], dict) and isinstance(b[key], dict):
            found += differences(a[key], b[key], f"{name}.")
        elif a[key] != b[key]:
            found.append(name)
    return found


def not_packable(job: JobConfig) -> str:
    """Why a run cannot be an ensemble member ('' when it can): only training runs of the
    built-in loop are packed, and what an ensemble refuses (trainer.ensemble_problems:
    tp, pp, meta-device init, another optimizer) keeps a run on its own."""
    if job.task != "train":
        return f"task={job.task}: only training runs are packed"
    if job.script.enabled:
        return "script.path: your own script trains its own way"
    if job.trainer.ensemble != 1:
        return f"trainer.ensemble={job.trainer.ensemble}: an ensemble already"
    refused = ensemble_problems(replace(job.trainer, ensemble=2), job.parallel, job.optim)
    if refused:
        return refused[0].split(" with trainer.ensemble")[0] + ": an ensemble cannot have it"
    return ""


def member_name(index: int, count: int) -> str:
    """r<index>, zero-padded to the width of the sweep's last index (r00..r15)."""
    return f"{MEMBER_PREFIX}{index:0{len(str(max(count - 1, 0)))}d}"


def members_of(runs: list[SweepRun], packable: dict[str, str], count: int) -> list[dict]:
    """One member dict per run: its name, its seed, and each other packable setting whose
    value differs within the pack (the rest is the job's, equal for all)."""
    varying = []
    for key, member_key in packable.items():
        values = []
        for run in runs:
            try:
                values.append(json.dumps(value_at(run.config, key), sort_keys=True))
            except KeyError:
                break
        if member_key != "seed" and len(values) == len(runs) and len(set(values)) > 1:
            varying.append((key, member_key))
    seed_key = next(k for k, m in packable.items() if m == "seed")
    return [
        {
            "name": member_name(run.index, count),
            "seed": value_at(run.config, seed_key),
            **{member: value_at(run.config, key) for key, member in varying},
        }
        for run in runs
    ]


def group(runs: list[SweepRun], packable: dict[str, str]) -> list[Pack]:
    """The sweep's runs in packs, in the order of their first run. Runs of one shape share
    a pack; a run that cannot be a member is a pack of its own; each pack after the first
    says what sets it apart from the first."""
    by_shape: dict[str, Pack] = {}
    packs: list[Pack] = []
    for run in runs:
        key = f"alone:{run.index}" if run.alone else shape_of(run.config, packable)
        if key not in by_shape:
            by_shape[key] = Pack([run], reason=run.alone)
            packs.append(by_shape[key])
        else:
            by_shape[key].runs.append(run)
    count = len(runs)
    first = packs[0].runs[0].config if packs else {}
    seed_key = next(k for k, m in packable.items() if m == "seed")
    for i, pack in enumerate(packs):
        if len(pack.runs) > 1:
            pack.members = members_of(pack.runs, packable, count)
            set_data_order(pack, seed_key)
        if i and not pack.reason:
            pack.reason = apart_reason(first, pack.runs[0].config, packable)
    return packs


def set_data_order(pack: Pack, seed_key: str) -> None:
    """The pack's data order: its data.order_seed (equal within a pack: it is part of the
    shape), else the first run's seed, set as data.order_seed when the members' seeds differ."""
    first = pack.runs[0].config
    try:
        given = value_at(first, DATA_SEED)
    except KeyError:  # a config from before data.order_seed: the seed orders the data
        given = None
    pack.data_seed = int(value_at(first, seed_key)) if given is None else int(given)
    seeds = {json.dumps(value_at(run.config, seed_key)) for run in pack.runs}
    pack.sets_data_seed = given is None and len(seeds) > 1
    pack.data_seed_given = given is not None


def apart_reason(first: dict[str, Any], other: dict[str, Any], packable: dict[str, str]) -> str:
    """'differs from pack 0 in model.dim, trainer.micro_batch_size' (a few keys, then a count)."""
    keys = differences(
        without(first, [*packable, *LEFT_OUT]), without(other, [*packable, *LEFT_OUT])
    )
    shown = ", ".join(WHY.get(k, k) for k in keys[:MAX_DIFFERENCES_SHOWN])
    more = (
        f" and {len(keys) - MAX_DIFFERENCES_SHOWN} more"
        if len(keys) > MAX_DIFFERENCES_SHOWN
        else ""
    )
    return f"differs from pack 0 in {shown}{more}"


def hydra_value(value: Any) -> str:
    """A member setting as Hydra's override grammar reads it back (names are checked by the
    trainer's config: letters, digits, '.', '_', '-'; numbers as Python writes them)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def pack_table(packs: list[Pack], pack_names: list[str]) -> list[str]:
    """Lines saying which run went where: `  [3] optim.lr=0.01 seed=1 -> pack0 member r03`
    (the overrides the sweep varies, redacted), per pack a heading with its size and, for
    packs after the first, why it is apart."""
    every = [run for pack in packs for run in pack.runs]
    common = set.intersection(*(set(run.overrides) for run in every)) if every else set()
    lines = []
    for pack, name in zip(packs, pack_names, strict=True):
        what = f"{len(pack.members)} members" if pack.packed else "a run of its own"
        why = f" ({pack.reason})" if pack.reason else ""
        lines.append(f"{name}: {what}{why}")
        if pack.packed:
            source = "data.order_seed" if pack.sets_data_seed or pack.data_seed_given else "seed"
            lines.append(f"  data order: seed {pack.data_seed} ({source}) for every member")
        for run, member in zip(pack.runs, pack.members or [{}], strict=False):
            where = f"{name} member {member['name']}" if pack.packed else name
            varied = [o for o in run.overrides if o not in common]
            lines.append(f"  [{run.index}] {' '.join(redact(varied)) or '(no change)'} -> {where}")
    return lines


POINTER = "packed.json"  # in each packed run's own dir: where its results are


def pointer(
    overrides: list[str], pack_dir: Path, member: str, data_seed: int, equals: str
) -> dict[str, Any]:
    """The small JSON a packed run's own dir holds: the pack's run dir, the member's name
    and directory (PACK/members/<name>/: member.json, metrics/, summary.json), the run's
    overrides (redacted), so `ls SWEEP/3` finds run 3's results, the data order its member
    saw and the plain run it equals (Pack.equals)."""
    return {
        "pack_run_dir": str(pack_dir),
        "member": member,
        "member_dir": str(pack_dir / "members" / member),
        "overrides": redact(overrides),
        "data_seed": data_seed,
        "equals": equals,
    }
