"""data.order_seed: the data order's own seed. Unset, the job's seed orders the data as before;
set to D, a run reads the batches of a run whose seed is D, whatever its own seed (the
model's initialisation). That is what an ensemble member equals: `seed=S data.order_seed=D`."""

from __future__ import annotations

from pathlib import Path

import torch

from toolkit.config.compose import group_config
from toolkit.config.data import DataConfig, DatasetConfig, problems
from toolkit.config.job import JobConfig
from toolkit.config.model import TransformerConfig
from toolkit.config.parallel import mesh_shape
from toolkit.distributed.env import DistEnv
from toolkit.tasks.train import batch_plan, build_loaders

SINGLE = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 0)


def first_batches(tmp_path: Path, seed: int, data_seed: int | None) -> list[torch.Tensor]:
    """Training step 0's and validation step 0's inputs of a tiny synthetic-token run."""
    job = JobConfig(seed=seed)
    job.data = DataConfig(kind="synthetic", seq_len=16, num_workers=0, order_seed=data_seed)
    job.trainer.micro_batch_size, job.trainer.global_batch_size = 4, 4
    plan = batch_plan(job, mesh_shape(job.parallel, 1), rank=0)
    train, val, _ = build_loaders(job, plan, torch.device("cpu"), tmp_path, SINGLE)
    try:
        return [train.batch(0)[0][0], val.batch(0)[0][0]]
    finally:
        train.close()
        val.close()


def test_unset_data_seed_is_the_jobs_seed_and_a_set_one_orders_the_data_alone(tmp_path):
    today = first_batches(tmp_path, seed=3, data_seed=None)
    assert all(torch.equal(a, b) for a, b in zip(today, first_batches(tmp_path, 3, 3), strict=True))
    # another model seed over data order 3: the same batches, training and validation
    moved = first_batches(tmp_path, seed=9, data_seed=3)
    assert all(torch.equal(a, b) for a, b in zip(today, moved, strict=True))
    # the job's seed 9 alone orders its data otherwise
    other = first_batches(tmp_path, seed=9, data_seed=None)
    assert not any(torch.equal(a, b) for a, b in zip(today, other, strict=True))


def test_a_negative_data_seed_is_one_line():
    bad = DataConfig(kind="synthetic", order_seed=-1)
    assert problems(bad, TransformerConfig()) == [
        "data.order_seed=-1: must be >= 0 (or null for the job's seed)"
    ]


def test_a_seed_keyword_of_your_dataset_is_still_yours():
    """The toolkit's key is `order_seed`: `seed` in a `_target_` data node stays a keyword
    argument of your Dataset, as before."""
    node = {"_target_": "userpkg.datasets.NoisySeries", "seed": 5, "order_seed": 2}
    cfg = group_config("data", node)
    assert isinstance(cfg, DatasetConfig)
    assert cfg.kwargs == {"seed": 5} and cfg.order_seed == 2
