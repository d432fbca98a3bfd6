"""Safety costs a step no collective of its own: the checkpoint and preemption hooks cast
their votes into the step's loss all-reduce, and the save-now file is watched by a thread."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tests.checkpoint.conftest import count_calls
from toolkit.checkpoint.hook import SaveNowWatcher
from toolkit.config.compose import compose_raw, to_job
from toolkit.distributed.env import DistEnv
from toolkit.tasks.train import build_trainer

STEPS = 3


def collectives_per_run(tmp_path, monkeypatch, checkpointing: bool) -> int:
    job = to_job(
        compose_raw(
            [
                "model=gpt_tiny",
                "data=synthetic",
                "data.seq_len=16",
                "data.num_workers=0",
                f"trainer.steps={STEPS}",
                "trainer.micro_batch_size=2",
                "trainer.eval_batches=0",
                "trainer.progress=false",
                "telemetry=off",
                f"checkpoint.enabled={str(checkpointing).lower()}",
                "checkpoint.save_final=false",
            ]
        )
    )
    env = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 0)
    run_dir = tmp_path / ("with" if checkpointing else "without")
    trainer = build_trainer(job, env, run_dir, torch.device("cpu"))
    calls = {name: count_calls(monkeypatch, dist, name) for name in ("all_reduce", "barrier")}
    try:
        trainer.fit()
    finally:
        trainer.sink.close()
        monkeypatch.undo()
    return sum(len(c) for c in calls.values())


def test_checkpointing_adds_no_collective_to_a_step(single_rank_group, tmp_path, monkeypatch):
    without = collectives_per_run(tmp_path, monkeypatch, checkpointing=False)
    with_hooks = collectives_per_run(tmp_path, monkeypatch, checkpointing=True)
    assert with_hooks == without


def test_the_save_now_file_is_seen_by_the_watcher_thread(tmp_path):
    trigger = tmp_path / "save-now"
    watcher = SaveNowWatcher(trigger, poll_s=0.05)
    try:
        assert not watcher.take()
        trigger.touch()
        deadline = time.monotonic() + 5
        while not watcher.requested.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.take() and not trigger.exists()  # consumed once
        assert not watcher.take()
    finally:
        watcher.close()
