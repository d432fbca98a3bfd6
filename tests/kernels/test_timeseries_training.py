"""The time-series model on its fused path through the real CLI: 2 ranks, data=returns,
model.kernels=liger with model.cross_section_norm on and a Huber loss (Triton kernels, under
TRITON_INTERPRET=1 on this CPU, inherited by the ranks): the loss falls, and its checkpoint
resumes on one rank with the same losses."""

from __future__ import annotations

import statistics

import pytest

from tests.checkpoint.conftest import losses
from tests.conftest import launch

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

STEPS = 10
FUSED = [
    "experiment=returns",
    "model.num_layers=1",
    "model.dim=32",
    "model.kernels=liger",
    "model.cross_section_norm=true",
    "model.loss=huber",
    "model.init_std=0.3",  # predictions far from the targets at first: a loss with room to fall
    "optim.lr=1e-2",
    "data.seq_len=8",
    "data.synthetic_times=3000",
    "data.num_workers=1",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=16",
    "trainer.eval_batches=1",
    "trainer.progress=false",
]
CKPT = ["checkpoint.enabled=true", "checkpoint.interval_steps=7"]


@pytest.mark.slow  # ~35 s on 2 CPU cores: interpreted Triton in every step, two runs
def test_fused_path_trains_and_its_checkpoint_resumes_on_one_rank(tmp_path) -> None:
    first, again = tmp_path / "first", tmp_path / "again"
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    done = launch(*FUSED, *CKPT, cache, f"hydra.run.dir={first}")
    assert done.returncode == 0, done.stderr[-3000:]
    reference = losses(first)
    assert sorted(reference) == list(range(1, STEPS + 1))
    curve = [reference[s] for s in sorted(reference)]
    assert statistics.mean(curve[-3:]) < 0.9 * statistics.mean(curve[:3]), curve

    source = first / "checkpoints" / "step-00000007"
    resume = [f"checkpoint.resume_from={source}", "cluster.tasks_per_node=1"]
    done = launch(*FUSED, *CKPT, cache, f"hydra.run.dir={again}", *resume)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = losses(again)
    assert sorted(resumed) == list(range(8, STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=1e-4)  # reduction order differs
