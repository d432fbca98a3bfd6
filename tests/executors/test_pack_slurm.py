"""A packed `-m` sweep on the dev Slurm cluster (launch.pack=auto): one array element per
pack, every run's results under its pack's members/<name>/, a pointer in each run's own
dir, and `toolkit runs` listing each member like a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.executors.test_slurm_executor import TINY, launch, with_repo

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.load_tolerant]


def test_a_packed_sweep_is_one_array_element_per_pack_and_lists_every_member(
    slurm_cluster, tmp_path
):
    # 2 learning rates x 2 seeds x 2 micro-batches: two shapes, so two packs of four.
    proc = launch(
        slurm_cluster,
        "-m",
        *TINY,
        "trainer.steps=2",
        "cluster=slurm",
        "launch.pack=auto",
        "cluster.array_parallelism=2",
        "optim.lr=0.001,0.002",
        "seed=1,2",
        "trainer.micro_batch_size=2,4",
        f"hydra.sweep.dir={tmp_path}",
        timeout_s=420,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "launch.pack=auto: 2 job(s) for the sweep's runs" in proc.stdout
    assert "pack1: 4 members (differs from pack 0 in trainer.micro_batch_size)" in proc.stdout
    # the seeds differ: every member sees the first run's data order, set as data.order_seed
    assert proc.stdout.count("  data order: seed 1 (data.order_seed) for every member") == 2
    ids = [
        json.loads((tmp_path / p / "slurm.json").read_text())["job_id"] for p in ("pack0", "pack1")
    ]
    array_id = ids[0].split("_")[0]
    assert ids == [f"{array_id}_0", f"{array_id}_1"]  # one array, one element per pack
    script = json.loads((tmp_path / "pack0" / "slurm.json").read_text())["sbatch_script"]
    assert "#SBATCH --array=0-1%2" in Path(script).read_text()

    members = {}
    for index in range(8):
        pointer = json.loads((tmp_path / str(index) / "packed.json").read_text())
        member_dir = Path(pointer["member_dir"])
        assert member_dir.parent.parent == Path(pointer["pack_run_dir"])
        assert not (tmp_path / str(index) / "slurm.json").exists()  # no job of its own
        summary = json.loads((member_dir / "summary.json").read_text())
        assert summary["steps"] == 2
        assert json.loads((member_dir / "member.json").read_text())["data_seed"] == 1
        assert pointer["data_seed"] == 1 and pointer["equals"].endswith(" data.order_seed=1")
        members[str(member_dir)] = pointer

    listed = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "runs", "--json", str(tmp_path)],
        cwd=REPO_ROOT,
        env=with_repo(slurm_cluster.env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    rows = {row["run_dir"]: row for row in json.loads(listed.stdout)}
    assert set(members) <= set(rows)  # every member listed like a run
    assert all(rows[m]["state"] == "completed" for m in members)
    # each member trained its own run's seed and learning rate
    for member_dir, pointer in members.items():
        run = dict(o.split("=", 1) for o in pointer["overrides"] if o[:5] in ("seed=", "optim"))
        own = {f"seed={run['seed']}", f"lr={float(run['optim.lr'])}"}
        assert own <= set(rows[member_dir]["overrides"]), (pointer, rows[member_dir])
