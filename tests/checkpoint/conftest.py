"""Helpers for checkpoint tests: run the real CLI on gpt_tiny and read what it wrote."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
# Tiny and fast; the data schedule is world-size independent (global batch fixed).
BASE = [
    "model=gpt_tiny",
    "data=text",  # world-size independent windows (SyntheticTokens seeds per rank slice)
    "data.seq_len=32",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=8",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "launch.follow=false",
]
CKPT = ["checkpoint.enabled=true", "checkpoint.interval_steps=2"]


def dcp_metadata(*files: str) -> bytes:
    """A `.metadata` as DCP pickles it, indexing one item in each of `files` (for tests
    that build a checkpoint's files by hand)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    storage = {MetadataIndex(f"w{i}"): _StorageInfo(f, 0, 1) for i, f in enumerate(files)}
    return pickle.dumps(Metadata(state_dict_metadata={}, storage_data=storage))


def cli(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "toolkit.launch", *BASE, *overrides, f"hydra.run.dir={run_dir}"]


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def launch(run_dir: Path, *overrides: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli(run_dir, *overrides), env=env(), capture_output=True, text=True, timeout=timeout_s
    )


@pytest.fixture
def start():
    """Launch in a session of its own, so the whole job (launcher and ranks) can be killed;
    whatever of it still runs when the test ends (passed or failed) is killed then."""
    jobs: list[subprocess.Popen] = []

    def launch_in_background(run_dir: Path, *overrides: str) -> subprocess.Popen:
        job = subprocess.Popen(
            cli(run_dir, *overrides),
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        jobs.append(job)
        return job

    yield launch_in_background
    for job in jobs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # the session's group: launcher and ranks
        job.wait()


def losses(run_dir: Path) -> dict[int, float]:
    """Loss per step from rank 0's metrics; a step run again after a resume overwrites."""
    out: dict[int, float] = {}
    path = run_dir / "metrics" / "rank0.jsonl"
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]
    return out


def events(run_dir: Path, name: str, rank: int = 0) -> list[dict]:
    path = run_dir / "metrics" / f"events-rank{rank}.jsonl"
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["name"] == name]


def logs(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*")))


def wait_for(predicate, timeout_s: float = 90, what: str = "condition") -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted(os.listdir(run_dir / "checkpoints"))


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> dict[int, float]:
    """Losses of an uninterrupted run without checkpointing."""
    run_dir = tmp_path_factory.mktemp("reference")
    done = launch(run_dir)
    assert done.returncode == 0, done.stderr
    return losses(run_dir)


@pytest.fixture(scope="session")
def checkpointed_run(tmp_path_factory) -> Path:
    """A finished run with checkpoints every 2 steps, keep_last=2 and keep_every=4.
    Tests that change it work on a copy (`copy_run`)."""
    run_dir = tmp_path_factory.mktemp("checkpointed")
    done = launch(run_dir, *CKPT, "checkpoint.keep_last=2", "checkpoint.keep_every=4")
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.fixture
def copy_run(checkpointed_run, tmp_path):
    def make() -> Path:
        dst = tmp_path / "run"
        shutil.copytree(checkpointed_run, dst)
        (dst / "metrics" / "rank0.jsonl").write_text("")  # keep only what the next run writes
        return dst

    return make


def count_calls(monkeypatch, owner, name: str) -> list[int]:
    """Replaces `owner.name` with a wrapper that records one entry per call and then calls
    the real function; returns the record."""
    calls: list[int] = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls
