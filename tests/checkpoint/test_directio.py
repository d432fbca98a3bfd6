"""Checkpoint shards are written around the page cache (O_DIRECT): the file holds exactly the
bytes written, whatever their alignment, its pages are not left in the page cache, and the
writer's own checksums are the ones a reader computes from the disk."""

import ctypes
import ctypes.util
import mmap
import os
import subprocess

import pytest
import torch

from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.checkpoint.directio import ALIGN, DirectFile, open_for_write
from toolkit.checkpoint.manifest import checksum_file, new_hash, read_manifest, verify
from toolkit.checkpoint.storage import LocalStorage
from toolkit.config.checkpoint import CheckpointConfig

from .test_overlap import model_and_optimizer

BUFFER = 4 * ALIGN  # small, so that a few KiB of writes fill it many times


@pytest.mark.parametrize("size", [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, BUFFER, 3 * BUFFER + 123])
def test_the_file_holds_exactly_the_bytes_written_without_padding(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "shard"
    f = DirectFile(path, buffer_bytes=BUFFER, checksum=new_hash())
    assert f.write(b"") == 0
    for start in range(0, size, 1000):  # uneven pieces, as torch.save writes them
        assert f.write(data[start : start + 1000]) == len(data[start : start + 1000])
    assert f.tell() == size
    f.close()
    assert path.read_bytes() == data
    assert f.checksum.hexdigest() == checksum_file(path)  # what it wrote is what is on disk


def test_large_writes_leave_no_pages_in_the_page_cache(tmp_path):
    path = tmp_path / "shard"
    f, direct = open_for_write(path, direct=True)
    assert direct, "this filesystem refuses O_DIRECT; the test needs one that allows it"
    f.write(os.urandom(4 << 20) * 4)  # 16 MiB, two of DirectFile's buffers
    f.close()
    assert cached_fraction(path) < 0.05

    buffered = tmp_path / "buffered"
    g, direct = open_for_write(buffered, direct=False)
    assert not direct
    g.write(os.urandom(4 << 20) * 4)
    g.close()
    assert cached_fraction(buffered) > 0.5  # the same write through the cache stays there


def test_buffer_size_must_be_a_multiple_of_the_alignment(tmp_path):
    with pytest.raises(ValueError, match="multiple of 4096"):
        DirectFile(tmp_path / "shard", buffer_bytes=ALIGN + 1)


@pytest.mark.parametrize("direct_io", [True, False])
def test_a_save_records_checksums_of_what_is_on_disk_and_loads_back(
    single_rank_group, tmp_path, direct_io
):
    cfg = CheckpointConfig(enabled=True, direct_io=direct_io)
    ckpt = Checkpointer(cfg, tmp_path, LocalStorage(direct_io), "{}", "cfg", torch.device("cpu"))
    model, optimizer = model_and_optimizer(seed=0)
    ckpt.save(3, model, optimizer, {"step": 3})
    (done,) = ckpt.wait()
    assert done.error is None
    assert done.writer.direct_io is direct_io

    shards = {p.name: e for p, e in done.writer.written.items() if p.suffix == ".distcp"}
    assert shards, "the writer reported no shards"
    manifest = read_manifest(done.path)
    for name, entry in shards.items():
        assert manifest.files[name] == entry
        assert entry.size_bytes == (done.path / name).stat().st_size
        assert entry.checksum == checksum_file(done.path / name)
    verify(done.path)

    fresh, fresh_optimizer = model_and_optimizer(seed=1)
    assert ckpt.load(done.path, fresh, fresh_optimizer)[0] == {"step": 3}
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    ckpt.close()


def cached_fraction(path) -> float:
    """The share of the file's pages resident in the page cache (mincore(2) on a mapping
    of it; mapping a file does not read it in)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        start = ctypes.c_char.from_buffer(m)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec)
        del start  # release the buffer export before the mapping is closed
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
    finally:
        m.close()
    return sum(v & 1 for v in vec) / pages


@pytest.fixture
def small_filesystem(tmp_path):
    """A real 600 KiB tmpfs (which takes O_DIRECT on Linux >= 6.6): room for one checkpoint
    of `model_and_optimizer` (~400 KB) but not two. Needs root, as the Slurm tests do."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_fails_the_save_with_the_path_and_keeps_the_previous_one(
    single_rank_group, small_filesystem
):
    cfg = CheckpointConfig(enabled=True, keep_last=2)
    ckpt = Checkpointer(cfg, small_filesystem, LocalStorage(), "{}", "cfg", torch.device("cpu"))
    model, optimizer = model_and_optimizer(seed=0)
    ckpt.save(1, model, optimizer, {"step": 1})
    (first,) = ckpt.wait()
    assert first.error is None

    ckpt.save(2, model, optimizer, {"step": 2})
    (second,) = ckpt.wait()
    assert second.error is not None
    assert "No space left on device" in second.error
    assert str(small_filesystem / "step-00000002.tmp") in second.error  # names the file
    assert not (small_filesystem / "step-00000002.tmp").exists()  # discarded
    verify(first.path)  # the previous committed checkpoint is intact
    ckpt.close()
