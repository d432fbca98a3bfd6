"""A checkpoint verifies completely or not at all: a file the manifest does not list, a
`.metadata` that is empty or unreadable, or a train state with an impossible step makes it
corrupt, and a resume falls back to the previous checkpoint as for a corrupt shard."""

import json
import shutil
from pathlib import Path

import pytest

from tests.checkpoint.conftest import CKPT, events, launch, logs, losses
from toolkit.checkpoint.layout import MANIFEST
from toolkit.checkpoint.manifest import CheckpointCorrupt, describe_files, verify
from toolkit.checkpoint.resume import latest_valid
from toolkit.checkpoint.storage import LocalStorage

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def rewrite_listed(ckpt: Path, rel: str, data: bytes) -> None:
    """Change a file and its manifest entry alike: the sizes and checksums still match."""
    (ckpt / rel).write_bytes(data)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    entry = describe_files(ckpt, [rel])[rel]
    manifest["files"][rel] = {"size_bytes": entry.size_bytes, "checksum": entry.checksum}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_shard_the_manifest_does_not_list_is_refused_and_resume_falls_back(copy_run, reference):
    run_dir = copy_run()
    ckpt = run_dir / "checkpoints" / "step-00000008"
    manifest = json.loads((ckpt / MANIFEST).read_text())
    del manifest["files"]["__1_0.distcp"]
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    shard = ckpt / "__1_0.distcp"
    with open(shard, "r+b") as f:
        f.seek(256)
        f.write(bytes(64))

    done = launch(run_dir, *CKPT)
    assert done.returncode == 0, done.stderr
    assert f"{shard}: not listed in {MANIFEST}" in logs(run_dir)
    assert events(run_dir, "restart")[0]["attrs"]["checkpoint"].endswith("step-00000006")
    assert losses(run_dir) == {7: reference[7], 8: reference[8]}


@pytest.mark.parametrize(
    ("rel", "data", "says"),
    [
        pytest.param(".metadata", b"", "unreadable DCP metadata", id="zero-byte-metadata"),
        pytest.param(".metadata", b"\x80\x05garbage", "unreadable DCP metadata", id="garbled"),
        pytest.param("train_state.json", b'{"step": -7}', "step -7 is impossible", id="negative"),
        pytest.param("train_state.json", b'{"step": 6}', "step 6 is impossible", id="other-step"),
        pytest.param("train_state.json", b"[1, 2]", "step None is impossible", id="not-object"),
    ],
)
def test_an_impossible_file_with_a_matching_manifest_falls_back(
    checkpointed_run, tmp_path, rel, data, says
):
    root = tmp_path / "checkpoints"
    shutil.copytree(checkpointed_run / "checkpoints", root)
    newest = root / "step-00000008"
    rewrite_listed(newest, rel, data)
    with pytest.raises(CheckpointCorrupt, match=says):
        verify(newest)
    assert latest_valid(LocalStorage(), root) == root / "step-00000006"


def test_a_file_that_metadata_refers_to_must_be_listed(checkpointed_run, tmp_path):
    ckpt = tmp_path / "step-00000008"
    shutil.copytree(checkpointed_run / "checkpoints" / "step-00000008", ckpt)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    del manifest["files"]["__0_0.distcp"]
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    (ckpt / "__0_0.distcp").unlink()  # neither on disk nor listed: .metadata still names it
    with pytest.raises(CheckpointCorrupt, match="refers to '__0_0.distcp'"):
        verify(ckpt)
