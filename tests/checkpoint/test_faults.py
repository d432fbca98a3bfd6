"""Faults never lose the previous committed checkpoint and never load garbage silently."""

import os
import signal

import pytest

from tests.checkpoint.conftest import (
    CKPT,
    checkpoint_names,
    events,
    launch,
    logs,
    losses,
    wait_for,
)
from toolkit.checkpoint.manifest import verify
from toolkit.errors import EXIT_SAVE_FAILED

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


@pytest.mark.slow
def test_sigkill_during_an_async_save_resumes_from_the_previous_commit(tmp_path, reference, start):
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    # The save of step 4 stalls in the writer: SIGKILL the whole job while it is in flight.
    job = start(run_dir, *CKPT, "fault.save_stall_step=4")
    wait_for(
        lambda: (
            (ckpts / "step-00000002").is_dir()
            and (ckpts / "step-00000004.tmp" / "rng" / "rank1.json").exists()
        ),
        what="a committed step 2 and an in-flight step 4",
    )
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert checkpoint_names(run_dir) == ["step-00000002", "step-00000004.tmp"]

    done = launch(run_dir, *CKPT)
    assert done.returncode == 0, done.stderr
    assert events(run_dir, "restart")[0]["attrs"]["checkpoint"].endswith("step-00000002")
    assert "removing torn checkpoint" in logs(run_dir)
    assert "step-00000004.tmp" not in checkpoint_names(run_dir)
    assert losses(run_dir) == reference


@pytest.mark.slow
def test_a_truncated_shard_falls_back_to_the_previous_checkpoint(copy_run, reference):
    run_dir = copy_run()
    shard = run_dir / "checkpoints" / "step-00000008" / "__1_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)
    done = launch(run_dir, *CKPT)
    assert done.returncode == 0, done.stderr
    assert f"{shard}: size" in logs(run_dir)  # the warning names the file
    assert events(run_dir, "restart")[0]["attrs"]["checkpoint"].endswith("step-00000006")
    assert losses(run_dir) == {7: reference[7], 8: reference[8]}


@pytest.mark.slow
def test_an_altered_shard_checked_by_another_rank_still_falls_back(copy_run, reference):
    # The ranks verify the checksums together, each a share of the files: with 2 ranks,
    # rank 1 checks __0_0.distcp. Its bytes change but not its size, so only rank 1 sees it.
    run_dir = copy_run()
    shard = run_dir / "checkpoints" / "step-00000008" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    done = launch(run_dir, *CKPT)
    assert done.returncode == 0, done.stderr
    assert f"{shard}: xxh3_128 checksum differs" in logs(run_dir)
    assert events(run_dir, "restart")[0]["attrs"]["checkpoint"].endswith("step-00000006")
    assert losses(run_dir) == {7: reference[7], 8: reference[8]}


@pytest.mark.slow
def test_a_truncated_shard_stops_the_job_when_fallback_is_off(copy_run):
    run_dir = copy_run()
    shard = run_dir / "checkpoints" / "step-00000008" / "__0_0.distcp"
    os.truncate(shard, 100)
    done = launch(run_dir, *CKPT, "checkpoint.on_corrupt=fail")
    assert done.returncode != 0
    assert f"{shard}: size 100 bytes" in done.stderr + logs(run_dir)
    assert losses(run_dir) == {}  # nothing trained on garbage


@pytest.mark.slow
def test_disk_full_keeps_the_previous_checkpoint_and_training_goes_on(copy_run):
    run_dir = copy_run()
    done = launch(run_dir, *CKPT, "trainer.steps=10", "fault.save_enospc_after_bytes=1000")
    assert done.returncode == 0, done.stderr
    failed = events(run_dir, "checkpoint_failed")
    assert [e["step"] for e in failed] == [10]
    assert "No space left on device" in failed[0]["attrs"]["error"]
    assert "step-00000010.tmp" in failed[0]["attrs"]["error"]  # the path is named
    assert sorted(losses(run_dir)) == [9, 10]
    assert checkpoint_names(run_dir) == ["step-00000004", "step-00000006", "step-00000008"]
    verify(run_dir / "checkpoints" / "step-00000008")


@pytest.mark.slow
def test_disk_full_stops_cleanly_when_configured(copy_run):
    run_dir = copy_run()
    done = launch(
        run_dir,
        "checkpoint.enabled=true",
        "checkpoint.interval_steps=1",
        "trainer.steps=14",
        "fault.save_enospc_after_bytes=1000",
        "checkpoint.on_save_error=stop",
    )
    assert done.returncode == EXIT_SAVE_FAILED
    assert "No space left on device" in logs(run_dir)
    assert max(losses(run_dir)) < 14
    verify(run_dir / "checkpoints" / "step-00000008")


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_refused_before_loading(copy_run):
    run_dir = copy_run()
    done = launch(run_dir, *CKPT, "model.dim=128")
    assert done.returncode != 0
    text = done.stderr + logs(run_dir)
    assert "does not fit this model" in text
    assert "shape of model.tok_emb.weight: checkpoint [256, 64], model [256, 128]" in text
    assert losses(run_dir) == {}
