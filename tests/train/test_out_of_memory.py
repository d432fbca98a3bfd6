"""Memory: the launcher checks a job on local CPU ranks against this host's available memory
shared by its ranks, not hardware=cpu's nominal 16 GB device; a rank that runs out all the
same says so in one line (what it tried to allocate, its memory, the settings to lower), and
its DataLoader workers end with it. The model and dataset live in tests/fixtures/userpkg, as
a user's would."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from tests.config.test_validation import job
from tests.conftest import REPO
from toolkit import descendants
from toolkit.config.errors import ConfigError
from toolkit.config.validate import validate
from toolkit.distributed.host_memory import host_bytes_per_rank
from toolkit.errors import EXIT_OUT_OF_MEMORY
from toolkit.launch import RUNTIME_CHECKS


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate(
            job("model=gpt_tiny", "trainer.micro_batch_size=100000", *overrides), RUNTIME_CHECKS
        )
    (line,) = err.value.problems
    return line


def test_local_cpu_ranks_are_checked_against_this_hosts_memory_per_rank():
    line = refusal("cluster.tasks_per_node=2")
    assert "(hardware=cpu: this host's available memory shared by 2 rank(s))" in line
    capacity_gib = float(re.search(r"> ([\d.,]+) GiB per device", line).group(1))
    assert capacity_gib == pytest.approx(host_bytes_per_rank(2) / 2**30, rel=0.2)
    assert "(hardware=h100)" in refusal("hardware=h100")  # a GPU profile: its own memory


# A layer 16M wide over a batch of 4096 windows: 256 GiB of activations, refused by the
# kernel at once (the parameters, 128 MiB, fit). The memory model does not cover a model of
# yours, so the launcher lets it start.
OOM = [
    "model._target_=userpkg.ensemble_models.WindowMLP",
    "model.num_series=1",
    "model.num_targets=1",
    "model.window=1",
    "model.hidden=16777216",
    "data=dataset",
    "data._target_=userpkg.datasets.NoisySeries",
    "+data.length=16384",
    "+data.window=1",
    "+data.num_series=1",
    "+data.num_targets=1",
    "+data.seq_len=1",
    "+data.num_workers=2",
    "trainer.micro_batch_size=4096",
    "trainer.steps=2",
    "trainer.progress=false",
    "cluster.tasks_per_node=1",
    "telemetry=off",
]


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_a_rank_out_of_memory_says_so_in_one_line_and_its_workers_end_with_it(tmp_path):
    paths = [str(REPO), str(REPO / "tests" / "fixtures")]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "toolkit.launch", *OOM, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[int] = set()  # every process of the run, the DataLoader workers among them
    while launcher.poll() is None:
        with contextlib.suppress(psutil.Error):
            seen.update(p.pid for p in psutil.Process(launcher.pid).children(recursive=True))
        time.sleep(0.05)
    _, err = launcher.communicate()
    assert launcher.returncode == EXIT_OUT_OF_MEMORY, err[-2000:]
    said = [line for line in err.splitlines() if " INFO " not in line]
    assert len(said) == 1, said
    assert said[0].startswith("error: rank 0 ran out of memory (tried to allocate 256.00 GiB; ")
    assert "host memory: " in said[0] and "lower trainer.micro_batch_size=4096" in said[0]
    assert len(seen) >= 3, seen  # the rank server, the rank and its workers were seen
    assert [p for p in seen if descendants.alive(p)] == []
