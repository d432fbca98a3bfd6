"""A job's own files (run ids, configs, hang summaries, failure records) are readable only by
its user and never seen half-written."""

from __future__ import annotations

import stat

import pytest

from toolkit.files import write_private


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_and_its_missing_directory_are_private(tmp_path):
    path = tmp_path / "tracking" / "mlflow_run_id"
    write_private(path, "abc123")
    assert path.read_text() == "abc123"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700


def test_an_older_copy_readable_by_others_is_replaced_not_written_through(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old: 1\n")
    path.chmod(0o644)
    inode = path.stat().st_ino
    write_private(path, "new: 2\n")
    assert path.read_text() == "new: 2\n" and mode(path) == 0o600
    assert path.stat().st_ino != inode  # a reader holding the old file sees it whole
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temporary left


def test_a_failed_write_names_the_file_asked_for_not_the_temporary(tmp_path):
    path = tmp_path / ("x" * 250)  # a legal name whose temporary's name is too long
    with pytest.raises(OSError) as caught:
        write_private(path, "x")
    assert caught.value.filename == str(path)
    assert list(tmp_path.iterdir()) == []
