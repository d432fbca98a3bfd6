"""Shared helpers: run the real CLI as a user would, and read what it left in the run dir;
the `slurm_cluster` fixture (a real three-node Slurm cluster on loopback) for the tests marked
`slurm`, wherever their code lives; a shell's NCCL variables kept out of the tests that ask.

The cluster is started once per test session with `scripts/dev-cluster up --nodes 3`
(a quick no-op when it already runs): jobs take two nodes, and a third one lets a job that
lost a node be requeued without it. Where it cannot be started (not root,
no apt-get) the Slurm tests are skipped with the reason, except under CI=true,
where they fail: CI must never pass by skipping its cluster tests.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

# Triton kernels (toolkit.kernels) run on the CPU through Triton's interpreter when no GPU is
# here: set before anything imports triton, and inherited by the ranks the tests start.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
UP_TIMEOUT_S = 300  # a first `up` may apt-get install Slurm, munge and MariaDB
CLUSTER_NODES = 3
QUIET_TIMEOUT_S = 60  # a job's epilog and slurmctld's cleanup take well under a second here


def launch(
    *overrides: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m toolkit.launch OVERRIDES...` in a subprocess; output captured as text."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), full_env.get("PYTHONPATH")) if p
    )
    full_env.update(env or {})
    return run_module("toolkit.launch", *overrides, env=full_env, timeout=timeout)


def run_module(
    module: str, *args: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS...` in the repository root with exactly `env`; output as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
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


@pytest.fixture
def clean_nccl_environment(monkeypatch):
    """The test must not see (or leak) NCCL variables of the shell that runs it."""
    from toolkit.nccl.known import is_nccl_family

    for name in list(os.environ):
        if is_nccl_family(name):
            monkeypatch.delenv(name)


@dataclass(frozen=True)
class SlurmCluster:
    """What a test needs to talk to the dev cluster."""

    script: Path
    env: dict[str, str]  # os.environ plus the exports of `dev-cluster env`
    node_names: list[str] = field(default_factory=lambda: ["n1", "n2", "n3"])
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

    def release_requeued(self, job_id: str, restarts: int = 1, timeout_s: float = 120) -> None:
        """Make a detached job, requeued from inside itself, eligible now, as a user in a
        hurry would: Slurm holds such a job its AuthInfo cred_expire (120 s) and nothing
        outside the job is there to lift it (docs/slurm.md). Waits for the requeue first."""
        from toolkit import slurm_records

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.run("scontrol", "show", "job", "-o", job_id).stdout
            records = slurm_records.parse_show_job(out)
            if records and records[0].state == "PENDING" and records[0].restarts >= restarts:
                update = ("scontrol", "update", f"JobId={job_id}", "StartTime=now")
                if self.run(*update).returncode == 0:
                    return
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} was not requeued ({restarts}) within {timeout_s} s")

    def busy(self) -> str:
        """What keeps the cluster from being quiet (jobs queued, nodes not idle); "" if quiet."""
        from toolkit.slurm_records import parse_sinfo_nodes

        jobs = self.run("squeue", "-h", "-o", "%i %T").stdout.splitlines()
        nodes = parse_sinfo_nodes(self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout)
        not_idle = [f"{node} {state}" for node, state in nodes.items() if state != "idle"]
        return "; ".join(line for line in [*jobs, *not_idle] if line.strip())

    def wait_quiet(self, timeout_s: float = QUIET_TIMEOUT_S) -> None:
        """Wait until no job is queued and every node is idle. An srun or a job that just
        ended leaves its nodes COMPLETING for a moment, and Slurm gives the next job the
        lowest-numbered idle nodes: a test that starts then finds n1 taken."""
        deadline = time.monotonic() + timeout_s
        while busy := self.busy():
            if time.monotonic() > deadline:
                raise AssertionError(f"the dev cluster is still busy after {timeout_s} s: {busy}")
            time.sleep(0.1)


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
            [str(DEV_CLUSTER), "up", "--nodes", str(CLUSTER_NODES)],
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


@pytest.fixture(autouse=True)
def _quiet_cluster(request) -> None:
    """Every Slurm test starts on a quiet cluster, whatever the test before it left running."""
    if "slurm_cluster" in request.fixturenames:
        request.getfixturevalue("slurm_cluster").wait_quiet()


def pytest_collection_modifyitems(config, items) -> None:
    """A test that uses the dev cluster is marked `slurm`: `make test` runs that marker in a
    stream of its own, beside the quick tests (scripts/test_suite.py)."""
    unmarked = [
        item.nodeid
        for item in items
        if "slurm_cluster" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("slurm") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests using the slurm_cluster fixture must be marked slurm: " + ", ".join(unmarked)
        )
