"""The parallel layout: one device mesh with named dimensions (pp, dp_replicate, dp_shard,
tp), plus activation checkpointing and compile.

dp_replicate x dp_shard is data parallelism: FSDP2 shards over dp_shard and, with
dp_replicate > 1, replicates over dp_replicate (HSDP). tp is tensor parallelism (inside a
node), pp pipeline parallelism (stages of consecutive layers). Their product is the world
size; one of them may be -1, "the rest" (dp_shard is, by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.config.errors import switch, switch_problems
from toolkit.config.model import (
    HFModelConfig,
    ModelConfig,
    TransformerConfig,
    display_name,
    supports,
)

PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


@dataclass
class ParallelConfig:
    # HSDP replica groups (1: plain FSDP over dp_shard ranks).
    dp_replicate: int = 1
    # FSDP shard group size; -1: whatever the other degrees leave of the world size.
    dp_shard: int = -1
    # Tensor-parallel degree (heads and MLP width split over tp ranks of one node).
    tp: int = 1
    # Pipeline stages (consecutive layers per stage).
    pp: int = 1
    # Pipeline schedule: gpipe | 1f1b | interleaved_1f1b.
    pp_schedule: str = "1f1b"
    # Stages per pipeline rank (interleaved_1f1b only: > 1).
    pp_virtual_stages: int = 1
    # Layers per stage, e.g. [5, 7] (empty: balanced by the performance model's per-layer cost).
    pp_split: list[int] = field(default_factory=list)
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False
    compile: bool = False
    # CUDA graphs for the compiled blocks (torch.compile mode "reduce-overhead"): auto | on |
    # off. on needs compile=true and a CUDA device; auto is off until measured with FSDP2 on
    # a GPU (toolkit.distributed.step_overhead says why).
    cuda_graphs: str = "auto"
    # Build parameters on the meta device and initialise after sharding (for models that do
    # not fit in host memory per rank). Initialisation then depends on the world size.
    meta_init: bool = False


@dataclass(frozen=True)
class MeshShape:
    """Resolved degrees of the mesh, outermost first: (pp, dp_replicate, dp_shard, tp).

    Global rank r sits at coordinates in row-major order with tp varying fastest, so a tp
    group is tp consecutive ranks (one node, when tp divides the ranks per node) and pp is
    the outermost dimension (stages across nodes)."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    NAMES = ("pp", "dp_replicate", "dp_shard", "tp")

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.tp)

    def degrees(self) -> dict[str, int]:
        return {
            "pp": self.pp,
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "tp": self.tp,
        }

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each sees its own slice of the global batch."""
        return self.dp_replicate * self.dp_shard

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's coordinate along every dimension."""
        out = {}
        for name, size in reversed(self.degrees().items()):
            out[name] = rank % size
            rank //= size
        return {name: out[name] for name in self.NAMES}

    def dp_rank(self, rank: int) -> int:
        """Which slice of the global batch this rank reads (same for its tp and pp peers)."""
        c = self.coords(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def groups(self, dim: str) -> list[list[int]]:
        """Global ranks of every group along `dim` (ranks that differ only in `dim`)."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            key = tuple(v for name, v in c.items() if name != dim)
            groups.setdefault(key, []).append(rank)
        return list(groups.values())

    def describe(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in self.degrees().items() if s > 1) or "1 rank"


def mesh_shape(par: ParallelConfig, world: int) -> MeshShape | str:
    """The degrees for `world` ranks, or one line saying why they do not multiply to it."""
    degrees = {
        "pp": par.pp,
        "dp_replicate": par.dp_replicate,
        "dp_shard": par.dp_shard,
        "tp": par.tp,
    }
    bad = [f"parallel.{n}={v}" for n, v in degrees.items() if v == 0 or v < -1]
    if bad:
        return f"{', '.join(bad)}: each degree must be >= 1 (or -1 for the rest of the world size)"
    rest = [n for n, v in degrees.items() if v == -1]
    if len(rest) > 1:
        return f"parallel.{' and parallel.'.join(rest)} are both -1: at most one degree may be -1"
    known = 1
    for v in degrees.values():
        known *= v if v != -1 else 1
    given = " x ".join(f"{n}={v}" for n, v in degrees.items() if v != -1)
    if rest:
        if world % known:
            return (
                f"parallel: {given} = {known} does not divide the world size {world}, so "
                f"parallel.{rest[0]}=-1 has no value; choose degrees whose product divides {world}"
            )
        degrees[rest[0]] = world // known
    elif known != world:
        return (
            f"parallel: {given} = {known} ranks, but the job has {world}; make the product equal "
            f"the world size (or set one degree to -1)"
        )
    return MeshShape(**degrees)


def pipeline_stages(par: ParallelConfig) -> int:
    """Stages in all: pp ranks times virtual stages per rank."""
    return par.pp * par.pp_virtual_stages


def problems(
    par: ParallelConfig,
    world: int,
    model: ModelConfig | None = None,
    grad_accum: int = 1,
    seq_len: int | None = None,
) -> list[str]:
    """Problems with the parallel layout for a job of `world` ranks, one line each."""
    shape = mesh_shape(par, world)
    if isinstance(shape, str):
        return [shape]
    p = switch_problems("parallel", par, ("cuda_graphs",))
    if switch(par.cuda_graphs) == "on" and not par.compile:
        p.append(
            "parallel.cuda_graphs=on needs parallel.compile=true: the CUDA graphs are "
            "torch.compile's (reduce-overhead mode over each block)"
        )
    if par.pp_schedule not in PP_SCHEDULES:
        p.append(
            f"parallel.pp_schedule={par.pp_schedule!r}: must be one of {', '.join(PP_SCHEDULES)}"
        )
    if par.pp_virtual_stages < 1:
        p.append(f"parallel.pp_virtual_stages={par.pp_virtual_stages}: must be >= 1")
    elif par.pp_virtual_stages > 1 and par.pp_schedule != "interleaved_1f1b":
        p.append(
            f"parallel.pp_virtual_stages={par.pp_virtual_stages} needs "
            "parallel.pp_schedule=interleaved_1f1b (the other schedules run one stage per rank)"
        )
    elif par.pp_schedule == "interleaved_1f1b" and shape.pp > 1 and par.pp_virtual_stages < 2:
        p.append("parallel.pp_schedule=interleaved_1f1b needs parallel.pp_virtual_stages >= 2")
    stages = shape.pp * max(1, par.pp_virtual_stages)
    if shape.pp > 1 and grad_accum < stages and par.pp_schedule != "gpipe":
        p.append(
            f"parallel.pp={shape.pp}: trainer.grad_accum={grad_accum} micro-batches are fewer "
            f"than the {stages} pipeline stages; {par.pp_schedule} needs at least {stages} "
            f"(raise trainer.grad_accum)"
        )
    rounds = max(1, grad_accum // shape.pp)
    if shape.pp > 1 and par.pp_schedule == "interleaved_1f1b" and grad_accum % rounds:
        p.append(
            f"parallel.pp_schedule=interleaved_1f1b: trainer.grad_accum={grad_accum} micro-batches "
            f"do not split into rounds of parallel.pp={shape.pp} (torch's schedule runs "
            f"{rounds} rounds); use a multiple of {shape.pp} or fewer than {2 * shape.pp}"
        )
    if model is not None:
        p += _model_problems(par, shape, model)
    if seq_len is not None and shape.tp > 1 and seq_len % shape.tp:
        p.append(
            f"parallel.tp={shape.tp} does not divide data.seq_len={seq_len}: sequence "
            "parallelism gives each tensor-parallel rank an equal share of the tokens"
        )
    return p


def _model_problems(par: ParallelConfig, shape: MeshShape, model: ModelConfig) -> list[str]:
    can = supports(model)
    name = display_name(model)
    p = []
    if can is not None and shape.tp > 1 and not can.tensor_parallel:
        p.append(
            f"parallel.tp={shape.tp}: model {name} has no tensor-parallel plan; give its "
            "ModelSpec a tensor_parallel function (docs/extending.md) or use parallel.tp=1"
        )
    if can is not None and shape.pp > 1 and not can.pipeline:
        p.append(
            f"parallel.pp={shape.pp}: model {name} has no pipeline split; give its ModelSpec "
            "a pipeline split (docs/extending.md) or use parallel.pp=1"
        )
    if isinstance(model, HFModelConfig) and shape.tp > 1 and par.meta_init:
        p.append(
            f"parallel.meta_init=true with parallel.tp={shape.tp}: a Hugging Face model's "
            "embeddings stay whole on every tensor-parallel rank, and each rank would "
            "initialise its copy with its own seed; use parallel.meta_init=false"
        )
    if not isinstance(model, TransformerConfig):
        return p
    hidden = int(model.dim * model.mlp_ratio)
    if shape.tp > 1 and can is not None and can.tensor_parallel:
        # rows of the row-wise split embeddings
        for field_name in ("vocab_size", "max_seq_len"):
            value = getattr(model, field_name, None)
            if value is not None and value % shape.tp:
                p.append(
                    f"parallel.tp={shape.tp} does not divide model.{field_name}={value} "
                    "(its embedding is split evenly over the tensor-parallel ranks)"
                )
        if model.num_heads % shape.tp:
            p.append(
                f"parallel.tp={shape.tp} does not divide model.num_heads={model.num_heads}: "
                "each tensor-parallel rank needs whole attention heads"
            )
        if hidden % shape.tp:
            p.append(
                f"parallel.tp={shape.tp} does not divide the MLP width {hidden} "
                f"(model.dim x model.mlp_ratio)"
            )
    stages = shape.pp * max(1, par.pp_virtual_stages)
    if par.pp_split:
        if len(par.pp_split) != stages:
            p.append(
                f"parallel.pp_split has {len(par.pp_split)} entries for {stages} pipeline stages "
                "(pp x pp_virtual_stages)"
            )
        elif sum(par.pp_split) != model.num_layers or min(par.pp_split) < 1:
            p.append(
                f"parallel.pp_split={par.pp_split}: entries must be >= 1 and add up to "
                f"model.num_layers={model.num_layers}"
            )
    elif shape.pp > 1 and model.num_layers < stages:
        p.append(
            f"parallel.pp={shape.pp}: model.num_layers={model.num_layers} cannot fill {stages} "
            "pipeline stages (each needs at least one layer)"
        )
    return p
