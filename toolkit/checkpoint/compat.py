"""Feature checks for the private pieces of torch.distributed.checkpoint (DCP) that the
checkpoint code uses, each with the public behaviour it falls back to.

GPU clusters bring their own torch, and private APIs change between releases without
notice. Each check runs where the piece is used (not at import, so that a test can take a
piece away) and returns None or False when the piece is missing or changed; the caller then
takes DCP's public path, and `fall_back` warns once per piece, naming what is lost. Nothing
here ever raises.

The pieces, what they are for, and the fallback:
- `_state_dict_stager.StateDictStager._stage_untyped_storage`, DefaultStager's
  `_state_dict_stager` (toolkit.checkpoint.staging): staging copies that leave the GIL to
  the training thread; without them, DCP's own copies (which hold it).
- `enable_plan_caching`, `_cached_plans_key` and SavePlanner's `_cached_*` dicts
  (toolkit.checkpoint.planning): reusing a save's plan; without them, every save plans.
- `filesystem._StorageInfo` (toolkit.checkpoint.storage): writing tensors from cached
  torch.save frames; without it, DCP's writer (torch.save per tensor).
- `FileSystemReader._get_metadata_path` (toolkit.checkpoint.storage): where `.metadata`
  lies; without it, `<checkpoint>/.metadata`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings
from typing import Any

_warned: set[str] = set()


class CompatWarning(RuntimeWarning):
    """A private DCP piece is missing or changed in this torch; a public fallback is used."""


def fall_back(piece: str, consequence: str) -> None:
    """Warn, once per process and piece, that `piece` is unusable and what that costs."""
    if piece in _warned:
        return
    _warned.add(piece)
    import torch

    warnings.warn(
        f"torch {torch.__version__}: DCP's {piece} is missing or changed; {consequence}",
        CompatWarning,
        stacklevel=3,
    )


def _attribute(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def state_dict_stager() -> type | None:
    """DCP's StateDictStager class, when it has the storage hook that staging overrides."""
    cls = _attribute("torch.distributed.checkpoint._state_dict_stager", "StateDictStager")
    if cls is None or not callable(getattr(cls, "_stage_untyped_storage", None)):
        fall_back(
            "_state_dict_stager.StateDictStager._stage_untyped_storage",
            "staging copies hold the GIL (DCP's own copies)",
        )
        return None
    return cls


def stager_parts(stager: Any, base: type) -> Any | None:
    """The StateDictStager inside DCP's DefaultStager, when it has what staging replaces."""
    inner = getattr(stager, "_state_dict_stager", None)
    needed = ("pin_memory", "pin_memory_min_bytes", "_cached_storage_mapping")
    if not isinstance(inner, base) or not all(hasattr(inner, n) for n in needed):
        fall_back(
            "DefaultStager._state_dict_stager", "staging copies hold the GIL (DCP's own copies)"
        )
        return None
    return inner


def plan_caching(caches: tuple[str, ...]) -> bool:
    """Whether DefaultSavePlanner can reuse plans under a key of the caller's (the
    `enable_plan_caching` argument, `_cached_plans_key` and SavePlanner's cache dicts)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import SavePlanner

    supported = (
        "enable_plan_caching" in inspect.signature(DefaultSavePlanner).parameters
        and all(isinstance(getattr(SavePlanner, name, None), dict) for name in caches)
        and hasattr(DefaultSavePlanner(enable_plan_caching=True), "_cached_plans_key")
    )
    if not supported:
        fall_back("save plan caching (SavePlanner._cached_*)", "every save plans afresh")
    return supported


def storage_info() -> type | None:
    """DCP's `_StorageInfo(relative_path, offset, length)`, which records where a shard's
    item lies, when it has those fields."""
    cls = _attribute("torch.distributed.checkpoint.filesystem", "_StorageInfo")
    fields = (
        [f.name for f in dataclasses.fields(cls)]
        if cls is not None and dataclasses.is_dataclass(cls)
        else []
    )
    if fields[:3] != ["relative_path", "offset", "length"]:
        fall_back(
            "filesystem._StorageInfo", "tensors are written by DCP's writer (torch.save each)"
        )
        return None
    return cls


def metadata_path(reader: Any, rank: int | None) -> str:
    """The path of a FileSystemReader's .metadata file (the rank's, where DCP has one)."""
    method = getattr(reader, "_get_metadata_path", None)
    if method is not None:
        try:
            return str(method(rank))
        except TypeError:
            pass
    fall_back("FileSystemReader._get_metadata_path", "reading <checkpoint>/.metadata")
    return str(reader.fs.concat_path(reader.path, ".metadata"))
