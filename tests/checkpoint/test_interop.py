"""Checkpoints are plain DCP directories: PyTorch's own converter reads them, and the export
script writes a consolidated model that loads into a fresh, unsharded model."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.checkpoint.conftest import REPO, env
from toolkit.config.compose import load_job
from toolkit.train.models import build_model

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def test_pytorch_dcp_to_torch_save_reads_a_checkpoint(checkpointed_run, tmp_path):
    out = tmp_path / "full.pt"
    dcp_to_torch_save(checkpointed_run / "checkpoints" / "step-00000008", out)
    state = torch.load(out, weights_only=True)
    assert set(state) == {"model", "optim"}
    assert state["model"]["tok_emb.weight"].shape == (256, 64)
    assert state["optim"]["state"]["tok_emb.weight"]["exp_avg"].shape == (256, 64)


@pytest.mark.slow
def test_export_script_writes_a_model_that_loads_for_inference(checkpointed_run, tmp_path):
    for fmt, name in (("safetensors", "model.safetensors"), ("torch", "model.pt")):
        out = tmp_path / name
        done = subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts" / "export_model.py"),
                str(checkpointed_run),
                str(out),
                "--format",
                fmt,
            ],
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        tensors = load_file(out) if fmt == "safetensors" else torch.load(out, weights_only=True)
        model = build_model(load_job(checkpointed_run / "config.yaml").model)
        model.load_state_dict(tensors, strict=True)  # every key, every shape


def test_export_names_a_corrupt_checkpoint(checkpointed_run, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "export_model.py"),
            str(tmp_path),
            str(tmp_path / "m"),
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "error:" in done.stderr and str(tmp_path) in done.stderr
