"""The toolkit's shard writer writes each tensor from a frame learnt once per layout instead of
pickling it every save, and its files are byte for byte the files DCP's own writer writes."""

import contextlib
import io

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.utils.serialization
from torch.distributed.checkpoint import FileSystemWriter

from tests.checkpoint.conftest import count_calls
from toolkit.checkpoint import serialization
from toolkit.checkpoint.serialization import FrameCache, layout_of
from toolkit.checkpoint.storage import LocalStorage, SafeFileSystemReader


def mixed_state(seed: int) -> dict:
    """Tensors of every kind a training state holds, plus non-tensor values."""
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(6, 8, generator=g)
    return {
        "weight": torch.randn(16, 8, generator=g),
        "half": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "transposed": torch.randn(8, 4, generator=g).t(),  # non-contiguous, owns its storage
        "view": big[2:4],  # a view: DCP saves a copy of its elements
        "step": torch.tensor(float(seed)),  # 0-dim, like the optimizer's step
        "ids": torch.randint(0, 1000, (7,), generator=g),
        "flags": torch.rand(9, generator=g) > 0.5,
        "lr": 0.001 * (seed + 1),  # non-tensor values: DCP's byte items
        "name": f"run-{seed}",
    }


def shard_bytes(path) -> bytes:
    (shard,) = path.glob("*.distcp")
    return shard.read_bytes()


def counted_torch_saves(monkeypatch) -> list[int]:
    return count_calls(monkeypatch, serialization.torch, "save")


@contextlib.contextmanager
def crc32(on: bool):
    """torch.save's per-record CRC-32 on or off (monkeypatch cannot undo torch's config)."""
    config = torch.utils.serialization.config.save
    saved, config.compute_crc32 = config.compute_crc32, on
    try:
        yield
    finally:
        config.compute_crc32 = saved


@pytest.fixture
def crc_off():
    """As the toolkit's writer sets it while it writes shards."""
    with crc32(False):
        yield


def test_shards_are_the_bytes_dcps_writer_writes_and_later_saves_skip_pickling(
    single_rank_group, tmp_path, monkeypatch
):
    frames = FrameCache()
    storage = LocalStorage(direct_io=False)
    ours = []
    for seed in (1, 2):  # the first save learns the frames, the second writes from them
        writer = storage.dcp_writer(tmp_path / f"ours-{seed}")
        writer.frames = frames
        with monkeypatch.context() as patch:
            saves = counted_torch_saves(patch)
            dcp.save(mixed_state(seed), storage_writer=writer)
        ours.append((seed, len(saves)))

        # DCP's own writer, with the CRC-32 off as the toolkit's writer turns it off
        with crc32(False):
            dcp_writer = FileSystemWriter(tmp_path / f"dcp-{seed}")
            dcp.save(mixed_state(seed), storage_writer=dcp_writer)
        assert shard_bytes(tmp_path / f"ours-{seed}") == shard_bytes(tmp_path / f"dcp-{seed}")

    tensors = sum(isinstance(v, torch.Tensor) for v in mixed_state(0).values())
    values = len(mixed_state(0)) - tensors  # DCP's planner pickles these into byte items
    assert ours == [(1, tensors + values), (2, values)]  # tensors pickled once per layout
    assert len(frames) == tensors

    back = {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
        for k, v in mixed_state(0).items()
    }
    dcp.load(back, storage_reader=SafeFileSystemReader(tmp_path / "ours-2"))
    for name, value in mixed_state(2).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(back[name], value), name
        else:
            assert back[name] == value, name


def test_a_tensor_from_frames_loads_with_torch_load(crc_off):
    frames = FrameCache()
    for values in (torch.arange(10.0), torch.arange(10.0) * -3):
        out = io.BytesIO()
        frames.save(values, out)
        assert torch.equal(torch.load(io.BytesIO(out.getvalue()), weights_only=True), values)
    assert len(frames) == 1


@pytest.mark.parametrize(
    "tensor",
    [
        torch.nn.Parameter(torch.ones(3)),  # a subclass
        torch.ones(8)[2:5],  # a view into a larger storage
        torch.empty(0),  # nothing to recognise the bytes by
        torch.ones(3).to_sparse(),
    ],
    ids=["parameter", "view", "empty", "sparse"],
)
def test_tensors_whose_archive_may_hold_more_than_their_layout_are_pickled(tensor, crc_off):
    assert layout_of(tensor) is None
    out = io.BytesIO()
    FrameCache().save(tensor, out)
    ref = io.BytesIO()
    torch.save(tensor, ref)
    assert out.getvalue() == ref.getvalue()


def test_with_the_crc_on_every_tensor_is_pickled():
    with crc32(True):
        assert layout_of(torch.ones(3)) is None  # the archive then depends on the values


def test_a_full_cache_learns_no_more_layouts(crc_off):
    frames = FrameCache(max_layouts=2)
    for n in range(1, 5):
        out = io.BytesIO()
        frames.save(torch.ones(n), out)
        assert torch.equal(torch.load(io.BytesIO(out.getvalue()), weights_only=True), torch.ones(n))
    assert len(frames) == 2
