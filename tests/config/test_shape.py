"""How many GPUs a local job gets when cluster.tasks_per_node is left to its default: NVML's
count narrowed by CUDA_VISIBLE_DEVICES as CUDA narrows it, without importing torch (the
launcher stays a light process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from toolkit.config.shape import visible_gpu_count


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, 8),  # unset: every GPU
        ("0,1,2,3", 4),
        ("3", 1),
        ("", 0),  # set but empty: none
        ("-1", 0),  # the usual way to hide every GPU
        ("0,1,9,2", 2),  # CUDA stops at the first index that names no device
        ("GPU-5b1c7a3e-0000-0000-0000-000000000000,1", 2),  # UUIDs name devices
        ("0,1,2,3,4,5,6,7,0", 8),  # never more than there are
        (" 2 , 5 ", 2),
    ],
)
def test_cuda_visible_devices_narrows_the_count_as_cuda_does(visible, expected):
    assert visible_gpu_count(8, visible) == expected


def test_a_default_local_job_is_composed_and_validated_without_importing_torch(tmp_path):
    probe = (
        "import sys\n"
        "from toolkit.config.compose import compose_raw, to_job\n"
        "from toolkit.config.shape import world_size\n"
        "from toolkit.config.validate import validate\n"
        "from toolkit.launch import RUNTIME_CHECKS\n"
        "job = to_job(compose_raw(['model=gpt_tiny']))\n"
        "validate(job, RUNTIME_CHECKS)\n"
        "print(world_size(job.cluster), 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", "False"]  # no GPU here: 2 CPU ranks, torch not loaded
