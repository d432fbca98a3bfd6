"""A crafted checkpoint cannot run code or read files outside its directory: pickles that
would build anything but checkpoint data are refused before they run, and paths that leave
the checkpoint directory are refused, each with one line naming the file."""

import dataclasses
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict

from tests.checkpoint.conftest import dcp_metadata
from tests.checkpoint.test_overlap import model_and_optimizer
from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.checkpoint.layout import MANIFEST, TRAIN_STATE, committed_path
from toolkit.checkpoint.manifest import (
    CheckpointCorrupt,
    FileEntry,
    build_manifest,
    checksum_file,
    verify,
)
from toolkit.checkpoint.storage import LocalStorage, SafeFileSystemReader
from toolkit.checkpoint.trust import UnsafeCheckpoint
from toolkit.config.checkpoint import CheckpointConfig


def stack_global_call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle of `module`.`name`(arg), written opcode by opcode (pickle itself
    never writes a dotted name under a module that does not define it)."""

    def text(s: str) -> bytes:
        data = s.encode()
        return pickle.SHORT_BINUNICODE + bytes([len(data)]) + data

    return (
        pickle.PROTO + b"\x04" + text(module) + text(name) + pickle.STACK_GLOBAL
        + text(arg) + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP
    )  # fmt: skip


class TouchesAFile:
    """Pickles as a call of os.system that creates `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_dotted_global_in_metadata_is_refused_before_it_resolves(tmp_path):
    marker = tmp_path / "ran"
    checkpoint = tmp_path / "step"
    checkpoint.mkdir()
    payload = stack_global_call(
        "torch.distributed.checkpoint.filesystem", "os.system", f"touch {marker}"
    )
    (checkpoint / ".metadata").write_bytes(payload)
    with pytest.raises(UnsafeCheckpoint) as refused:
        SafeFileSystemReader(checkpoint).read_metadata()
    assert str(refused.value) == (
        f"{checkpoint / '.metadata'}: refers to torch.distributed.checkpoint.filesystem.os.system, "
        "which is not a DCP metadata type; refusing to load it"
    )
    assert not marker.exists()


def test_honest_metadata_names_only_allowed_types(single_rank_group, tmp_path):
    model, optimizer = model_and_optimizer(seed=0)
    model.to(torch.bfloat16)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=FileSystemWriter(tmp_path))
    metadata = SafeFileSystemReader(tmp_path).read_metadata()
    assert metadata.state_dict_metadata["model.0.weight"].properties.dtype == torch.bfloat16


def write_run_checkpoint(directory, model, optimizer, lr) -> None:
    """What Checkpointer.save writes, with `lr` as the optimizer's learning rate."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    optim_sd["param_groups"][0]["lr"] = lr
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=FileSystemWriter(directory))
    (directory / TRAIN_STATE).write_text('{"step": 2}')


def test_a_pickle_in_an_optimizer_item_is_refused_and_never_runs(single_rank_group, tmp_path):
    marker = tmp_path / "ran"
    checkpoint = committed_path(tmp_path, 2)
    model, optimizer = model_and_optimizer(seed=0)
    write_run_checkpoint(checkpoint, model, optimizer, TouchesAFile(marker))
    ckpt = Checkpointer(
        CheckpointConfig(enabled=True), tmp_path, LocalStorage(), "{}", "cfg", torch.device("cpu")
    )
    fresh, fresh_optimizer = model_and_optimizer(seed=1)
    try:
        with pytest.raises(UnsafeCheckpoint) as refused:
            ckpt.load(checkpoint, fresh, fresh_optimizer)
    finally:
        ckpt.close()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{checkpoint / '__0_0.distcp'}: item 'optim.param_groups")
    assert "system" in message and message.endswith("refusing to load it")
    assert not marker.exists()


def test_plain_optimizer_items_still_load(single_rank_group, tmp_path):
    checkpoint = committed_path(tmp_path, 2)
    model, optimizer = model_and_optimizer(seed=0)
    write_run_checkpoint(checkpoint, model, optimizer, 0.125)
    ckpt = Checkpointer(
        CheckpointConfig(enabled=True), tmp_path, LocalStorage(), "{}", "cfg", torch.device("cpu")
    )
    fresh, fresh_optimizer = model_and_optimizer(seed=1)
    assert ckpt.load(checkpoint, fresh, fresh_optimizer)[0] == {"step": 2}
    ckpt.close()
    group = fresh_optimizer.param_groups[0]
    assert group["lr"] == 0.125 and group["betas"] == optimizer.param_groups[0]["betas"]
    assert torch.equal(fresh[0].weight, model[0].weight)


def checkpoint_listing(tmp_path, relative: str, target):
    """A committed checkpoint whose manifest lists `relative` with the size and checksum
    of `target`, so that only the path itself is wrong."""
    d = committed_path(tmp_path, 2)
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(dcp_metadata())
    manifest = build_manifest(d, 2, 1, "abc")
    manifest.files[relative] = FileEntry(target.stat().st_size, checksum_file(target))
    (d / MANIFEST).write_text(manifest.to_json())
    return d


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_a_manifest_path_outside_the_checkpoint_is_refused(tmp_path, how):
    outside = tmp_path / "secret"
    outside.write_text("not part of any checkpoint")
    d = committed_path(tmp_path, 2)
    relative = os.path.relpath(outside, d) if how == "dotdot" else str(outside)
    d = checkpoint_listing(tmp_path, relative, outside)
    with pytest.raises(CheckpointCorrupt) as refused:
        verify(d)
    assert str(refused.value) == (
        f"{d / MANIFEST}: lists {relative!r}, a path outside the checkpoint directory; refused"
    )


def test_a_manifest_naming_etc_passwd_is_refused(tmp_path):
    d = committed_path(tmp_path, 2)
    relative = os.path.relpath("/etc/passwd", d)
    d = checkpoint_listing(tmp_path, relative, Path("/etc/passwd"))
    with pytest.raises(CheckpointCorrupt, match=rf"{MANIFEST}: lists '(\.\./)+etc/passwd'"):
        verify(d)


def test_a_symlink_leading_out_of_the_checkpoint_is_refused(tmp_path):
    outside = tmp_path / "secret"
    outside.write_text("not part of any checkpoint")
    d = checkpoint_listing(tmp_path, "__0_0.distcp", outside)
    (d / "__0_0.distcp").symlink_to(outside)
    with pytest.raises(CheckpointCorrupt) as refused:
        verify(d)
    assert str(refused.value) == (
        f"{d / MANIFEST}: lists '__0_0.distcp', a symlink leading out of {d}; refused"
    )


def test_a_metadata_path_outside_the_checkpoint_is_refused(single_rank_group, tmp_path):
    d = tmp_path / "step"
    dcp.save({"w": torch.ones(4)}, storage_writer=FileSystemWriter(d))
    metadata = pickle.loads((d / ".metadata").read_bytes())  # our own, honest file
    metadata.storage_data = {
        index: dataclasses.replace(info, relative_path="../elsewhere.distcp")
        for index, info in metadata.storage_data.items()
    }
    (d / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointCorrupt) as refused:
        SafeFileSystemReader(d).read_metadata()
    assert str(refused.value) == (
        f"{d / '.metadata'}: lists '../elsewhere.distcp', a path outside the checkpoint "
        "directory; refused"
    )
