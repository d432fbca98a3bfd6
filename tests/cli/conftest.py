"""Helpers for the `toolkit` command's tests: run it (or the launcher) in a subprocess with
no site or user config directory of the machine in the way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_module

REPO = Path(__file__).resolve().parents[2]


def isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env["TOOLKIT_SITE_CONF"] = str(tmp_path / "no-site")
    env["TOOLKIT_USER_CONF"] = str(tmp_path / "no-user")
    env.pop("TOOLKIT_CONFIG_PATH", None)
    env.update(extra)
    return env


def toolkit(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    """`toolkit ARGS...` (python -m toolkit.cli) in the repository root."""
    return run_module("toolkit.cli", *args, env=env or isolated_env(tmp_path), timeout=timeout)


@pytest.fixture
def no_site_dirs(tmp_path, monkeypatch):
    """In-process tests: no site or user config directory, no TOOLKIT_CONFIG_PATH."""
    monkeypatch.setenv("TOOLKIT_SITE_CONF", str(tmp_path / "no-site"))
    monkeypatch.setenv("TOOLKIT_USER_CONF", str(tmp_path / "no-user"))
    monkeypatch.delenv("TOOLKIT_CONFIG_PATH", raising=False)


# Two small real runs that the readers' tests share (each about 4 s of CPU, once per session):
# a samples model (the time-series transformer over the synthetic market, whose unit is
# samples) and a token model (gpt_tiny). Telemetry on, one checkpoint, as a user's run.
READER_RUN = [
    "trainer.steps=4",
    "trainer.global_batch_size=8",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "checkpoint.enabled=true",
    "checkpoint.interval_steps=2",
    "launch.follow=false",
]


def _reader_run(root: Path, name: str, *model: str) -> Path:
    import subprocess
    import sys

    run_dir = root / name
    done = subprocess.run(
        [sys.executable, "-m", "toolkit.launch", *model, *READER_RUN, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=isolated_env(root),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


@pytest.fixture(scope="session")
def samples_run(tmp_path_factory) -> Path:
    """A finished run of a samples model (model=ts_transformer data=returns)."""
    return _reader_run(
        tmp_path_factory.mktemp("readers"), "samples", "model=ts_transformer", "data=returns"
    )


@pytest.fixture(scope="session")
def tokens_run(tmp_path_factory) -> Path:
    """A finished run of a token model (model=gpt_tiny, 32-token windows)."""
    return _reader_run(
        tmp_path_factory.mktemp("readers"), "tokens", "model=gpt_tiny", "data.seq_len=32"
    )
