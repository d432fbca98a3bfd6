"""Where this torch lacks (or changed) a private DCP piece that the checkpoint code uses,
saves and loads take DCP's public path instead: one warning names what is lost, and the
checkpoint still holds and restores the state."""

import dataclasses
import importlib
import warnings

import pytest
import torch
import torch.distributed.checkpoint.filesystem as filesystem
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import SavePlanner

from tests.checkpoint.test_overlap import model_and_optimizer
from toolkit.checkpoint import compat
from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.checkpoint.compat import CompatWarning
from toolkit.checkpoint.storage import LocalStorage
from toolkit.config.checkpoint import CheckpointConfig

# piece -> (its owner, the attribute taken away)
PIECES = {
    "gil-free staging": (
        lambda: importlib.import_module("torch.distributed.checkpoint._state_dict_stager"),
        "StateDictStager",
    ),
    "plan caching": (lambda: SavePlanner, "_cached_save_plan"),
    "metadata path": (lambda: FileSystemReader, "_get_metadata_path"),
}


@pytest.fixture
def no_warnings_given_yet(monkeypatch):
    monkeypatch.setattr(compat, "_warned", set())


@pytest.mark.parametrize("piece", sorted(PIECES))
def test_without_a_private_piece_saves_and_loads_fall_back_with_one_warning(
    single_rank_group, tmp_path, monkeypatch, no_warnings_given_yet, piece
):
    owner, name = PIECES[piece]
    monkeypatch.delattr(owner(), name)
    cfg = CheckpointConfig(enabled=True, async_save=True, overlap_staging=True, cache_plans=True)
    model, optimizer = model_and_optimizer(seed=0)
    with pytest.warns(CompatWarning) as caught:
        ckpt = Checkpointer(cfg, tmp_path, LocalStorage(), "{}", "cfg", torch.device("cpu"))
        for step in (1, 2):  # the second save would reuse the first one's plan
            ckpt.save(step, model, optimizer, {"step": step})
            ckpt.wait_staged()
            (done,) = ckpt.wait()
            assert done.error is None
        fresh, fresh_optimizer = model_and_optimizer(seed=1)
        assert ckpt.load(done.path, fresh, fresh_optimizer)[0] == {"step": 2}
        ckpt.close()
    assert len([w for w in caught if issubclass(w.category, CompatWarning)]) == 1
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_a_changed_storage_record_falls_back_to_dcps_writer(monkeypatch, no_warnings_given_yet):
    @dataclasses.dataclass
    class StorageInfo:  # fields renamed in some other torch
        path: str
        start: int
        size: int

    monkeypatch.setattr(filesystem, "_StorageInfo", StorageInfo)
    with pytest.warns(CompatWarning, match="_StorageInfo is missing or changed; tensors are"):
        assert compat.storage_info() is None
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert compat.storage_info() is None
    assert again == []  # warned once only
