"""Resume through the real CLI: a signal checkpoints and exits, a relaunch in the same run
directory continues with bitwise the same losses; other world sizes load the same checkpoint."""

import signal

import psutil
import pytest

from tests.checkpoint.conftest import (
    CKPT,
    STEPS,
    checkpoint_names,
    events,
    launch,
    losses,
    wait_for,
)
from toolkit.checkpoint.manifest import verify
from toolkit.errors import EXIT_PREEMPTED

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def test_an_uninterrupted_checkpointed_run_matches_the_reference(checkpointed_run, reference):
    assert losses(checkpointed_run) == reference
    # keep_last=2 keeps 6 and 8, keep_every=4 also keeps 4; 2 was deleted.
    assert checkpoint_names(checkpointed_run) == ["step-00000004", "step-00000006", "step-00000008"]
    saves = events(checkpointed_run, "checkpoint")
    assert [e["step"] for e in saves] == [2, 4, 6, 8]
    assert all(e["attrs"]["async"] and e["attrs"]["size_bytes"] > 0 for e in saves)
    # DCP's background writer ran at the default priority, below the training thread's.
    assert {e["attrs"]["writer_priority"] for e in saves} == {"idle"}
    # Each rank checksummed its own shard; rank 0 put both in the manifest, and they verify.
    manifest = verify(checkpointed_run / "checkpoints" / "step-00000008")
    assert {"__0_0.distcp", "__1_0.distcp", "rng/rank1.json"} <= set(manifest.files)
    assert manifest.checksum_algorithm == "xxh3_128"


def rank_process(launcher_pid: int, rank: int) -> psutil.Process:
    """Local rank `rank` of a launcher: an exec'd rank by its RANK variable; a forked one
    (launch.rank_start=fork) as the rank server's child, which forks the ranks in order."""
    for child in psutil.Process(launcher_pid).children():
        try:
            if "toolkit.rank_server" in child.cmdline():
                forked = sorted(child.children(), key=lambda p: (p.create_time(), p.pid))
                if rank < len(forked):
                    return forked[rank]
            elif (
                child.environ().get("RANK") == str(rank) and "toolkit.entrypoint" in child.cmdline()
            ):
                return child
        except psutil.Error:
            continue
    raise LookupError(f"rank {rank} not running")


@pytest.mark.slow
def test_a_signal_checkpoints_exits_75_and_a_relaunch_resumes_bitwise(tmp_path, reference, start):
    run_dir = tmp_path / "run"
    job = start(run_dir, "checkpoint.enabled=true")
    log0 = run_dir / "logs" / "rank0.log"
    wait_for(
        lambda: log0.exists() and "preemption signals armed" in log0.read_text(), what="hook start"
    )
    rank_process(job.pid, 1).send_signal(signal.SIGUSR2)  # one rank only: all ranks must agree
    out, _ = job.communicate(timeout=120)
    assert job.returncode == EXIT_PREEMPTED, out
    stopped_at = events(run_dir, "preemption")[0]["step"]
    assert 1 <= stopped_at < STEPS
    assert "received SIGUSR2" in (run_dir / "logs" / "rank0.log").read_text()
    assert checkpoint_names(run_dir) == [f"step-{stopped_at:08d}"]

    done = launch(run_dir, "checkpoint.enabled=true")
    assert done.returncode == 0, done.stderr
    restart = events(run_dir, "restart")[0]
    assert restart["step"] == stopped_at
    assert losses(run_dir) == reference  # bitwise: same floats, every step


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_one_rank(checkpointed_run, reference, tmp_path):
    run_dir = tmp_path / "one"
    source = checkpointed_run / "checkpoints" / "step-00000004"
    done = launch(run_dir, *CKPT, f"checkpoint.resume_from={source}", "cluster.tasks_per_node=1")
    assert done.returncode == 0, done.stderr
    resumed = losses(run_dir)
    assert sorted(resumed) == [5, 6, 7, 8]  # the data position continues at step 5
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=1e-4)  # reduction order differs
    assert events(run_dir, "restart")[0]["attrs"]["saved_world_size"] == 2


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_four_ranks(checkpointed_run, reference, tmp_path):
    run_dir = tmp_path / "four"
    source = checkpointed_run / "checkpoints" / "step-00000004"
    done = launch(run_dir, *CKPT, f"checkpoint.resume_from={source}", "cluster.tasks_per_node=4")
    assert done.returncode == 0, done.stderr
    resumed = losses(run_dir)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=1e-4)


@pytest.mark.slow
def test_touching_save_now_checkpoints_at_the_next_step(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "save-now").touch()
    done = launch(run_dir, "checkpoint.enabled=true", "checkpoint.save_final=false")
    assert done.returncode == 0, done.stderr
    assert checkpoint_names(run_dir) == ["step-00000001"]  # the trigger is consumed
