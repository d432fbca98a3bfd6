"""The manifest names the bad file; discovery ignores torn and corrupt checkpoints."""

import hashlib
import json
import os
import pickle

import pytest

from tests.checkpoint.conftest import dcp_metadata
from toolkit.checkpoint.discovery import remove_torn
from toolkit.checkpoint.layout import MANIFEST, committed_path, tmp_path
from toolkit.checkpoint.manifest import (
    CheckpointCorrupt,
    FileEntry,
    build_manifest,
    checksum_file,
    verify,
)
from toolkit.checkpoint.resume import latest_valid
from toolkit.checkpoint.storage import LocalStorage, SafeFileSystemReader


def make_checkpoint(root, step, payload=b"x" * 1000):
    d = committed_path(root, step)
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(dcp_metadata("__0_0.distcp"))
    (d / "__0_0.distcp").write_bytes(payload)
    (d / MANIFEST).write_text(build_manifest(d, step, 2, "abc").to_json())
    return d


def test_a_truncated_shard_is_named(tmp_path):
    d = make_checkpoint(tmp_path, 2)
    os.truncate(d / "__0_0.distcp", 10)
    with pytest.raises(CheckpointCorrupt, match=r"__0_0\.distcp: size 10 bytes.*truncated"):
        verify(d)


def test_an_altered_shard_is_named(tmp_path):
    d = make_checkpoint(tmp_path, 2)
    (d / "__0_0.distcp").write_bytes(b"y" * 1000)  # same size, other bytes
    with pytest.raises(CheckpointCorrupt, match=r"__0_0\.distcp: xxh3_128 checksum differs"):
        verify(d)


def test_checksums_other_ranks_reported_are_used_only_while_the_size_matches(tmp_path):
    d = tmp_path / "step"
    d.mkdir()
    (d / ".metadata").write_bytes(dcp_metadata())
    (d / "__1_0.distcp").write_bytes(b"z" * 100)
    reported = {"__1_0.distcp": FileEntry(100, "from-rank-1")}
    assert build_manifest(d, 2, 2, "abc", reported).files["__1_0.distcp"].checksum == "from-rank-1"
    reported = {"__1_0.distcp": FileEntry(99, "stale")}  # the file changed since: hash it here
    entry = build_manifest(d, 2, 2, "abc", reported).files["__1_0.distcp"]
    assert entry == FileEntry(100, checksum_file(d / "__1_0.distcp"))


def test_checkpoints_committed_with_sha256_manifests_still_verify(tmp_path):
    d = committed_path(tmp_path, 2)
    d.mkdir(parents=True)
    files = {".metadata": dcp_metadata("__0_0.distcp"), "__0_0.distcp": b"x" * 1000}
    for name, data in files.items():
        (d / name).write_bytes(data)
    old = {  # format 1, as the first release wrote it
        "step": 2,
        "world_size": 2,
        "config_hash": "abc",
        "created_unix": 0.0,
        "format_version": 1,
        "files": {
            n: {"size_bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
            for n, b in files.items()
        },
    }
    (d / MANIFEST).write_text(json.dumps(old))
    assert verify(d).checksum_algorithm == "sha256"
    (d / "__0_0.distcp").write_bytes(b"y" * 1000)
    with pytest.raises(CheckpointCorrupt, match=r"__0_0\.distcp: sha256 checksum differs"):
        verify(d)


def test_latest_skips_torn_and_corrupt(tmp_path, caplog):
    make_checkpoint(tmp_path, 2)
    bad = make_checkpoint(tmp_path, 4)
    (bad / "__0_0.distcp").write_bytes(b"")
    tmp_path_6 = tmp_path_of(tmp_path, 6)
    assert latest_valid(LocalStorage(), tmp_path) == committed_path(tmp_path, 2)
    assert "step-00000004/__0_0.distcp" in caplog.text
    with pytest.raises(CheckpointCorrupt, match="on_corrupt=fail"):
        latest_valid(LocalStorage(), tmp_path, fallback=False)
    assert remove_torn(LocalStorage(), tmp_path) == [tmp_path_6]
    assert not tmp_path_6.exists()


def tmp_path_of(root, step):
    d = tmp_path(root, step)
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"partial")
    return d


class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_metadata_that_would_run_code_is_refused(tmp_path):
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        SafeFileSystemReader(tmp_path).read_metadata()
