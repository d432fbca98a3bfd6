"""A checkpoint records the torch and toolkit versions that wrote it. DCP reads checkpoints
of an older torch but not of a newer one (its metadata gains fields), so resuming under an
older torch than the writer's stops the job with one line before any rank loads; manifests
written before the versions were recorded load as before."""

import json

import pytest
import torch

import toolkit
from tests.checkpoint.conftest import CKPT, launch, logs, losses
from tests.checkpoint.test_manifest import make_checkpoint
from toolkit.checkpoint.layout import MANIFEST
from toolkit.checkpoint.manifest import (
    CheckpointTooNew,
    check_torch_version,
    read_manifest,
    verify,
)
from toolkit.checkpoint.resume import Candidate, choose_together, latest_valid
from toolkit.checkpoint.storage import LocalStorage
from toolkit.errors import EXIT_CHECKPOINT_UNUSABLE

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def rewrite_manifest(directory, **fields) -> None:
    """Set (or, with None, remove) fields of the manifest, as another writer would have."""
    raw = json.loads((directory / MANIFEST).read_text())
    for key, value in fields.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (directory / MANIFEST).write_text(json.dumps(raw))


def test_the_manifest_names_the_torch_and_toolkit_that_wrote_it(tmp_path):
    d = make_checkpoint(tmp_path, 2)
    manifest = read_manifest(d)
    assert manifest.torch_version == torch.__version__
    assert manifest.toolkit_version == toolkit.__version__


def test_a_checkpoint_of_a_newer_torch_is_refused_even_where_fallback_is_allowed(tmp_path):
    make_checkpoint(tmp_path, 2)
    d = make_checkpoint(tmp_path, 4)
    rewrite_manifest(d, torch_version="99.1.0+cu130", toolkit_version="9.9.0")
    with pytest.raises(CheckpointTooNew) as refused:
        choose_together([Candidate(d, fallback=True)], checksums=True, rank=0, world_size=1)
    assert str(refused.value) == (
        f"{d}: written by torch 99.1.0+cu130 (toolkit 9.9.0), this job runs torch "
        f"{torch.__version__} (toolkit {toolkit.__version__}), which cannot read checkpoints "
        "of a newer torch; resume with torch>=99.1.0, or start without this checkpoint"
    )
    with pytest.raises(CheckpointTooNew):  # not skipped for the older step-2
        latest_valid(LocalStorage(), tmp_path)


def test_a_manifest_without_versions_still_loads(tmp_path):
    d = make_checkpoint(tmp_path, 2)
    rewrite_manifest(d, torch_version=None, toolkit_version=None)
    manifest = verify(d)
    assert manifest.torch_version is None and manifest.toolkit_version is None
    assert latest_valid(LocalStorage(), tmp_path) == d


@pytest.mark.parametrize(
    "written, running",
    [("2.13.0", "2.15.0"), ("2.15.0+cu128", "2.15.0+cpu"), ("2.15.0", "2.15.0a0+git1234")],
)
def test_an_older_or_same_release_is_readable(tmp_path, written, running):
    d = make_checkpoint(tmp_path, 2)
    rewrite_manifest(d, torch_version=written)
    check_torch_version(d, read_manifest(d), running)  # no error


@pytest.mark.slow
def test_resuming_a_newer_torchs_checkpoint_stops_before_any_rank_loads(copy_run):
    run_dir = copy_run()
    for step in (4, 6, 8):
        rewrite_manifest(run_dir / "checkpoints" / f"step-{step:08d}", torch_version="99.0.0")
    done = launch(run_dir, *CKPT)
    assert done.returncode == EXIT_CHECKPOINT_UNUSABLE
    assert len(done.stderr.strip().splitlines()) == 1  # one line from rank 0, no traceback
    text = done.stderr + logs(run_dir)
    assert "cannot resume: " in text and "written by torch 99.0.0" in text
    assert "too many values to unpack" not in text
    assert losses(run_dir) == {}
