"""Which checkpoints retention keeps, and that its worker survives failures."""

from pathlib import Path

from toolkit.checkpoint.retention import Purger, steps_to_delete


def test_keeps_the_last_k():
    assert steps_to_delete([2, 4, 6, 8], keep_last=2, keep_every=0) == [2, 4]


def test_keeps_every_mth_step_forever():
    assert steps_to_delete([2, 4, 6, 8, 10, 12], keep_last=1, keep_every=4) == [2, 6, 10]


def test_never_deletes_the_newest():
    assert steps_to_delete([5], keep_last=0, keep_every=0) == []
    assert steps_to_delete([], keep_last=2, keep_every=0) == []


def test_a_failed_deletion_is_skipped_and_the_worker_goes_on(tmp_path, caplog):
    removed: list[Path] = []

    def remove(path: Path) -> None:
        if path.name == "bad":
            raise PermissionError(f"{path}: read-only")
        removed.append(path)

    purger = Purger(remove)
    purger.submit(tmp_path / "bad")
    purger.submit(tmp_path / "good")
    purger.close()
    assert removed == [tmp_path / "good"]
    assert "could not remove" in caplog.text and "bad" in caplog.text
