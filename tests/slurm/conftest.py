"""The `slurm_cluster` fixture: a real two-node Slurm cluster on loopback.

The cluster is started once per test session with `scripts/dev-cluster up`
(a quick no-op when it already runs). Where it cannot be started (not root,
no apt-get) the Slurm tests are skipped with the reason, except under CI=true,
where they fail: CI must never pass by skipping its cluster tests.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEV_CLUSTER = REPO_ROOT / "scripts" / "dev-cluster"
UP_TIMEOUT_S = 300  # a first `up` may apt-get install Slurm, munge and MariaDB


@dataclass(frozen=True)
class SlurmCluster:
    """What a test needs to talk to the dev cluster."""

    script: Path
    env: dict[str, str]  # os.environ plus the exports of `dev-cluster env`
    node_names: list[str] = field(default_factory=lambda: ["n1", "n2"])
    partition: str = "debug"

    def run(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command (e.g. sinfo, sbatch) against the cluster, capturing text output."""
        return subprocess.run(
            list(args),
            check=False,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: needs the local dev Slurm cluster (scripts/dev-cluster up)"
    )


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"dev Slurm cluster unavailable under CI=true: {reason}", pytrace=False)
    pytest.skip(f"dev Slurm cluster unavailable: {reason}")


def _exports(script: Path) -> dict[str, str]:
    """Parse the `export NAME=VALUE` lines printed by `dev-cluster env`."""
    out = subprocess.run([str(script), "env"], capture_output=True, text=True, check=True).stdout
    exports = {}
    for line in out.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export":
            name, _, value = words[1].partition("=")
            exports[name] = value
    return exports


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        _unavailable("scripts/dev-cluster up needs root")
    try:
        proc = subprocess.run(
            [str(DEV_CLUSTER), "up"],
            check=False,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        _unavailable(f"scripts/dev-cluster up took more than {UP_TIMEOUT_S}s")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        _unavailable(f"scripts/dev-cluster up failed:\n{tail}")
    exports = _exports(DEV_CLUSTER)
    os.environ.update(exports)
    yield SlurmCluster(script=DEV_CLUSTER, env=dict(os.environ))
