"""experiment=returns through the real CLI: the synthetic market out of the box, the
information coefficient and data-wait share in the summary, and a checkpoint (loader
position and normalisation included) that resumes on another world size with workers."""

from __future__ import annotations

import json

import pytest

from tests.checkpoint.conftest import losses
from tests.conftest import launch

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

TINY = [
    "experiment=returns",
    "model.num_layers=1",
    "model.dim=32",
    "data.seq_len=16",
    "data.synthetic_times=3000",
    "data.num_workers=2",
    "trainer.steps=8",
    "trainer.global_batch_size=8",
    "trainer.eval_batches=2",
    "trainer.progress=false",
]
CKPT = ["checkpoint.enabled=true", "checkpoint.interval_steps=2", "checkpoint.keep_every=4"]


@pytest.mark.slow
def test_a_returns_checkpoint_resumes_on_one_rank_with_the_same_data(tmp_path) -> None:
    first = tmp_path / "first"
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    done = launch(*TINY, *CKPT, cache, f"hydra.run.dir={first}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((first / "summary.json").read_text())
    assert -1 <= summary["val_ic"] <= 1 and 0 <= summary["data_wait_share"] < 1
    state = json.loads((first / "checkpoints" / "step-00000004" / "train_state.json").read_text())
    saved = json.loads((first / "data_normalisation.json").read_text())
    assert state["loader"]["next_step"] == 4 and state["loader"]["normalisation"] == saved

    again = tmp_path / "again"
    source = first / "checkpoints" / "step-00000004"
    done = launch(
        *TINY,
        *CKPT,
        cache,
        f"hydra.run.dir={again}",
        f"checkpoint.resume_from={source}",
        "cluster.tasks_per_node=1",
        "data.num_workers=1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reference, resumed = losses(first), losses(again)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=1e-4)
