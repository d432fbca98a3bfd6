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
