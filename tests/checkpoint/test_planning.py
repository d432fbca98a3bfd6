"""A save of a state whose structure is unchanged reuses the previous save's plan, writes the
new values all the same, and plans afresh once the structure changes; each checkpointer's
plans are its own."""

import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.default_planner as default_planner
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlanner

from tests.checkpoint.conftest import count_calls
from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.checkpoint.layout import committed_path
from toolkit.checkpoint.planning import PlanCache
from toolkit.checkpoint.storage import LocalStorage, SafeFileSystemReader
from toolkit.config.checkpoint import CheckpointConfig


def global_plans_built(monkeypatch) -> list[int]:
    """Counts rank 0's global plannings (DCP's own function, wrapped)."""
    return count_calls(monkeypatch, default_planner, "create_default_global_save_plan")


def save_and_read_back(state, path, planner) -> dict[str, torch.Tensor]:
    dcp.save(state, storage_writer=FileSystemWriter(path), planner=planner)
    back = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(back, storage_reader=SafeFileSystemReader(path))
    return back


def test_unchanged_structure_reuses_the_plan_and_still_writes_the_new_values(
    single_rank_group, tmp_path, monkeypatch
):
    planned = global_plans_built(monkeypatch)
    cache = PlanCache()
    state = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(4)}

    first = save_and_read_back(state, tmp_path / "1", cache.planner())
    assert len(planned) == 1

    state = {k: v * 2 + 1 for k, v in state.items()}  # new values, same structure
    second = save_and_read_back(state, tmp_path / "2", cache.planner())
    assert len(planned) == 1  # the cached plan was used
    for name, value in state.items():
        assert torch.equal(second[name], value), name
        assert not torch.equal(first[name], value), name

    state["extra"] = torch.full((5,), 7.0)  # the structure changed: planned afresh
    third = save_and_read_back(state, tmp_path / "3", cache.planner())
    assert len(planned) == 2
    assert torch.equal(third["extra"], state["extra"])
    cache.clear()


def test_each_cache_keeps_its_own_plans_until_cleared(single_rank_group, tmp_path):
    a, b = PlanCache(), PlanCache()
    writer = FileSystemWriter(tmp_path / "a")
    dcp.save({"x": torch.ones(3)}, storage_writer=writer, planner=a.planner())
    assert a.key in SavePlanner._cached_metadata and b.key not in SavePlanner._cached_metadata
    a.clear()
    caches = [getattr(SavePlanner, n) for n in dir(SavePlanner) if n.startswith("_cached_")]
    assert caches and not any(a.key in cache for cache in caches)


def test_checkpointer_saves_with_reused_plans_and_forgets_them_on_close(
    single_rank_group, tmp_path, monkeypatch
):
    planned = global_plans_built(monkeypatch)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    ckpt = Checkpointer(
        CheckpointConfig(enabled=True, keep_last=3),
        tmp_path,
        LocalStorage(),
        "{}",
        "cfg",
        torch.device("cpu"),
    )
    expected = {}
    for step in (1, 2, 3):
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        expected[step] = {k: v.clone() for k, v in model.state_dict().items()}
        ckpt.save(step, model, optimizer, {"step": step})
        ckpt.wait_staged()
        (done,) = ckpt.wait()
        assert done.error is None
    assert len(planned) == 1  # steps 2 and 3 reused step 1's plan
    for step in (1, 2, 3):
        fresh = torch.nn.Linear(8, 4)
        ckpt.load(committed_path(tmp_path, step), fresh, torch.optim.AdamW(fresh.parameters()))
        for name, value in fresh.state_dict().items():
            assert torch.equal(value, expected[step][name]), (step, name)
    key = ckpt._plans.key
    ckpt.close()
    assert key not in SavePlanner._cached_metadata
