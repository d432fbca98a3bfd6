"""Loading a checkpoint into this rank's model and optimizer, resharded to any world size.

A load first checks the checkpoint's keys and shapes against the model from its metadata
alone (`check_fits`), so that nothing is touched when it was written for another model; then
DCP reads this rank's shards of model and optimizer state (`load_into`: the load path's one
call of get_state_dict and of set_state_dict), with non-tensor items read as plain data only
(toolkit.checkpoint.trust); last, the trainer state and this rank's RNG state (JSON,
`read_train_state`). The Checkpointer (toolkit.checkpoint.checkpointer) calls these with its
storage and process group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from toolkit.checkpoint.layout import TRAIN_STATE, rng_file
from toolkit.checkpoint.state import mismatches, tensor_shapes
from toolkit.checkpoint.trust import SafeLoadPlanner, first_unsafe


class CheckpointMismatch(ValueError):
    """The checkpoint's tensors do not fit the current model (another model config)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or []


def check_fits(path: Path, reader: Any, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Raise CheckpointMismatch when the checkpoint's tensors do not fit the model (keys,
    shapes), reading only its metadata (`reader`: the storage's DCP reader of `path`):
    nothing is touched."""
    model_sd, _ = get_state_dict(model, optimizer)
    raise_if_mismatched(path, reader.read_metadata(), model_sd, keys_elsewhere(model))


def raise_if_mismatched(
    path: Path, metadata: Any, model_sd: dict[str, Any], elsewhere: frozenset[str] = frozenset()
) -> None:
    """CheckpointMismatch listing (the first 30 of) the keys whose shapes differ or that one
    side lacks; `elsewhere`: keys that other ranks hold (keys_elsewhere)."""
    problems = mismatches(metadata, tensor_shapes(model_sd, "model"), "model", elsewhere)
    if problems:
        shown = "\n  ".join(problems[:30])
        more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        raise CheckpointMismatch(
            f"checkpoint {path} does not fit this model ({len(problems)} mismatched keys; "
            f"written with another model config?):\n  {shown}{more}",
            problems,
        )


def load_into(
    path: Path,
    reader: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    pg: dist.ProcessGroup,
) -> None:
    """Load model and optimizer shards (any world size) from `path` into `model` and
    `optimizer`, over the process group `pg`. Checks keys and shapes against the model first:
    nothing is touched on a mismatch. Raises UnsafeCheckpoint (one line naming the file) when
    a non-tensor item is not plain data."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    raise_if_mismatched(path, reader.read_metadata(), model_sd, keys_elsewhere(model))
    state = {"model": model_sd, "optim": optim_sd}
    own_groups = [list(group["params"]) for group in optim_sd.get("param_groups", [])]
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(path), process_group=pg)
    except (Exception, CheckpointException) as exc:
        unsafe = first_unsafe(exc)
        if unsafe is not None:  # one line naming the file, not DCP's per-rank report
            raise unsafe from None
        raise
    keep_own_param_names(state["optim"], own_groups)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def read_train_state(path: Path, rank: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The checkpoint's trainer state and rank `rank`'s RNG state (None when the checkpoint
    had no such rank), both JSON."""
    train_state = json.loads((path / TRAIN_STATE).read_text())
    rng_path = path / rng_file(rank)
    rng = json.loads(rng_path.read_text()) if rng_path.is_file() else None
    return train_state, rng


def keep_own_param_names(optim_sd: dict[str, Any], own: list[list[str]]) -> None:
    """After a load, each param group lists this rank's parameters again, with the saved
    hyperparameters. A checkpoint holds one copy of the groups' parameter names (DCP keeps
    one rank's), which on a pipeline stage names another stage's parameters; groups match
    by position (the same optimizer on every rank)."""
    groups = optim_sd.get("param_groups", [])
    if len(groups) == len(own):
        for group, names in zip(groups, own, strict=True):
            group["params"] = names


def keys_elsewhere(model: nn.Module) -> frozenset[str]:
    """DCP keys of the model's tensors that other ranks hold (a pipeline stage sets
    `keys_elsewhere` to the other stages' state-dict keys): a checkpoint has them all."""
    return frozenset(f"model.{k}" for k in getattr(model, "keys_elsewhere", ()))
