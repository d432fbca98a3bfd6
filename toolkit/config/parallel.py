"""Data-parallel layout: FSDP2 (fully_shard) or HSDP, plus activation checkpointing and compile."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    # HSDP: replicate over `replicate` groups, shard within groups of size world/replicate.
    # 1 means plain FSDP (shard over all ranks).
    replicate: int = 1
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False
    compile: bool = False
    # Build parameters on the meta device and initialise after sharding (for models that do
    # not fit in host memory per rank). Initialisation then depends on the world size.
    meta_init: bool = False


def problems(par: ParallelConfig, world: int) -> list[str]:
    """Problems with the parallel layout for a job of `world` ranks, one line each."""
    if par.replicate < 1 or world % par.replicate:
        return [
            f"parallel.replicate={par.replicate}: must divide the world size {world} "
            "(HSDP shards within world/replicate ranks)"
        ]
    return []
