"""A commit renames `step-N.tmp/` to `step-N/` only once the names of the files in it are
durable: after its files are written, every directory inside it and then the directory
itself are fsynced (a file's fsync makes its data durable, not its directory entry)."""

import os
import stat
from pathlib import Path

import torch

from tests.checkpoint.test_overlap import model_and_optimizer
from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.checkpoint.layout import RNG_DIR, committed_path
from toolkit.checkpoint.layout import tmp_path as uncommitted_path
from toolkit.checkpoint.storage import LocalStorage
from toolkit.config.checkpoint import CheckpointConfig


class RecordingStorage(LocalStorage):
    """LocalStorage that records its renames in `events`."""

    def __init__(self, events: list):
        super().__init__()
        self.events = events

    def rename(self, src: Path, dst: Path) -> None:
        self.events.append(("rename", src))
        super().rename(src, dst)


def record_directory_fsyncs(monkeypatch, events: list) -> None:
    """Every os.fsync of a directory is recorded in `events` (with the directory's path),
    then done."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}"))))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_every_directory_of_a_save_is_fsynced_before_the_commit_rename(
    single_rank_group, tmp_path, monkeypatch
):
    events: list = []
    record_directory_fsyncs(monkeypatch, events)
    cfg = CheckpointConfig(enabled=True)
    ckpt = Checkpointer(cfg, tmp_path, RecordingStorage(events), "{}", "cfg", torch.device("cpu"))
    model, optimizer = model_and_optimizer(seed=0)
    ckpt.save(2, model, optimizer, {"step": 2}, blocking=True)
    (done,) = ckpt.wait()
    ckpt.close()
    assert done.error is None and done.path == committed_path(tmp_path, 2)

    tmp = uncommitted_path(tmp_path, 2)
    rename = events.index(("rename", tmp))
    synced = [path for kind, path in events[:rename] if kind == "fsync"]
    assert tmp / RNG_DIR in synced and tmp in synced
    assert synced.index(tmp / RNG_DIR) < synced.index(tmp)  # the inner directory first
    assert ("fsync", tmp_path) in events[rename:]  # the rename itself is made durable too
