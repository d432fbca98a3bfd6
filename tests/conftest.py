"""Shared helpers: run the real CLI as a user would, and read what it left in the run dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def launch(
    *overrides: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m toolkit.launch OVERRIDES...` in a subprocess; output captured as text."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), full_env.get("PYTHONPATH")) if p
    )
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "toolkit.launch", *overrides],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=full_env,
    )


def losses(run_dir: Path, rank: int = 0) -> list[float]:
    """Per-step losses a run recorded (global mean over ranks)."""
    with open(run_dir / "metrics" / f"rank{rank}.jsonl") as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


@pytest.fixture
def tiny() -> list[str]:
    """Overrides for a few-second 2-rank run of the tiny model."""
    return [
        "model=gpt_tiny",
        "trainer.steps=8",
        "trainer.log_every=4",
        "trainer.progress=false",
        "data.seq_len=64",
    ]


@pytest.fixture(scope="module")
def single_rank_group(tmp_path_factory):
    """A real one-rank gloo process group in the test process, for code that needs
    torch.distributed initialised (destroyed after the module's tests)."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("store") / "pg"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
