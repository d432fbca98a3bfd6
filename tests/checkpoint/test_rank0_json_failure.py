"""A save whose train state cannot be written on rank 0 alone fails on every rank within the
save, instead of leaving the other ranks in DCP's collectives until the hang watchdog."""

import pytest

from tests.checkpoint.conftest import CKPT, checkpoint_names, events, losses, wait_for

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


@pytest.mark.slow
def test_rank_0_failing_its_train_state_fails_the_save_and_training_goes_on(tmp_path, start):
    run_dir = tmp_path / "run"
    job = start(run_dir, *CKPT, "fault.data_delay_s=0.3", "checkpoint.keep_last=5")
    steps = run_dir / "metrics" / "rank0.jsonl"
    wait_for(lambda: steps.exists() and steps.read_text().strip(), what="the first step")
    # A directory where rank 0 writes step 4's train_state.json: only rank 0's write fails.
    (run_dir / "checkpoints" / "step-00000004.tmp" / "train_state.json").mkdir(parents=True)

    out, _ = job.communicate(timeout=120)  # the watchdog would end a stuck job after 300 s
    assert job.returncode == 0, out
    (failed,) = events(run_dir, "checkpoint_failed")
    assert failed["step"] == 4 and "train_state.json" in failed["attrs"]["error"]
    assert checkpoint_names(run_dir) == ["step-00000002", "step-00000006", "step-00000008"]
    assert sorted(losses(run_dir)) == list(range(1, 9))
