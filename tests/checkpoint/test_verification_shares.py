"""Ranks that resume together split the size checks of a checkpoint's files: each stats its
share (every world-th file), rank 0 also lists the directory, and their gathered verdicts
still name every truncated or unlisted file. Without the split every rank stats every file,
world x (2 world + 3) operations on the shared file system (docs/fault.md, Recovery at
scale)."""

import os

import pytest

from tests.checkpoint.conftest import dcp_metadata
from toolkit.checkpoint.layout import MANIFEST, committed_path
from toolkit.checkpoint.manifest import CheckpointCorrupt, build_manifest, verify_sizes
from toolkit.checkpoint.resume import _check_share

WORLD = 4


def checkpoint_of(root, ranks: int):
    """A committed checkpoint laid out as `ranks` ranks write it: a shard and an RNG file each."""
    d = committed_path(root, 5)
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(dcp_metadata("__0_0.distcp"))
    for r in range(ranks):
        (d / f"__{r}_0.distcp").write_bytes(b"x" * (100 + r))
        (d / f"rng-rank{r}.json").write_text("{}")
    (d / MANIFEST).write_text(build_manifest(d, 5, ranks, "abc").to_json())
    return d


def failing_shares(d) -> list[int]:
    failed = []
    for k in range(WORLD):
        try:
            verify_sizes(d, share=(k, WORLD))
        except CheckpointCorrupt:
            failed.append(k)
    return failed


@pytest.mark.parametrize("name", ["__0_0.distcp", "__3_0.distcp", "rng-rank2.json", ".metadata"])
def test_each_truncated_file_is_found_by_exactly_one_rank(tmp_path, name):
    d = checkpoint_of(tmp_path, WORLD)
    assert failing_shares(d) == []
    os.truncate(d / name, 1)
    assert len(failing_shares(d)) == 1
    with pytest.raises(CheckpointCorrupt, match="truncated or altered"):
        verify_sizes(d)  # one process alone still checks every file


def test_an_unlisted_file_is_found_by_rank_0_which_lists_the_directory(tmp_path):
    d = checkpoint_of(tmp_path, WORLD)
    (d / "__9_0.distcp").write_bytes(b"planted")
    assert failing_shares(d) == [0]


def test_the_shares_verdicts_agree_with_one_process_checking_everything(tmp_path):
    d = checkpoint_of(tmp_path, WORLD)
    os.truncate(d / "__1_0.distcp", 1)
    verdicts = [_check_share(d, True, k, WORLD) for k in range(WORLD)]
    corrupt = [v for v in verdicts if v is not None]
    assert len(corrupt) == 1 and corrupt[0][0] == "corrupt" and "__1_0.distcp" in corrupt[0][1]
    assert _check_share(d, True, 0, 1) == corrupt[0]
