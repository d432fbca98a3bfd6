"""A benchmark's ranks as processes on this machine, each with the environment the local
launcher gives rank k of n (`toolkit.executors.local.rank_env`: RANK, WORLD_SIZE,
MASTER_ADDR, ...), so that `toolkit.distributed.env.discover()` finds it as in a real job."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_ranks(worker: Callable[..., None], world: int, run_dir: Path, *args: Any) -> None:
    """Run `worker(rank, world, *args)` in `world` new processes, rank k with rank k's
    environment, and wait for all of them; raises if any of them failed."""
    import torch.multiprocessing as mp

    from toolkit.distributed.env import free_port
    from toolkit.executors.local import rank_env

    port = free_port()
    envs = [rank_env(rank, world, port, run_dir) for rank in range(world)]
    mp.spawn(_as_rank, args=(envs, worker, world, args), nprocs=world)


def _as_rank(
    rank: int, envs: list[dict[str, str]], worker: Callable[..., None], world: int, args: tuple
) -> None:
    os.environ.update(envs[rank])
    worker(rank, world, *args)
