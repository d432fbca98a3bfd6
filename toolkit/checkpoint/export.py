"""Consolidate a sharded checkpoint's model weights into one file for inference, in one
process (no process group): safetensors by default, or torch.save."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from toolkit.checkpoint.layout import checkpoints_dir
from toolkit.checkpoint.manifest import CheckpointCorrupt, verify
from toolkit.checkpoint.resume import latest_valid
from toolkit.checkpoint.storage import LocalStorage, SafeFileSystemReader

log = logging.getLogger(__name__)

FORMATS = ("safetensors", "torch")


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory as given (verified), or a run directory's latest valid one."""
    path = path.expanduser().resolve()
    if checkpoints_dir(path).is_dir():
        found = latest_valid(LocalStorage(), checkpoints_dir(path))
        if found is None:
            raise CheckpointCorrupt(
                f"{path}: no committed checkpoint under {checkpoints_dir(path)}"
            )
        return found
    verify(path)
    return path


def load_model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The full (unsharded) model tensors of a checkpoint, on CPU, keyed by parameter name."""
    # The planner rebuilds the state dict from the metadata (as PyTorch's dcp_to_torch_save).
    state: dict = {}
    _load_state_dict(
        state,
        storage_reader=SafeFileSystemReader(checkpoint),
        planner=_EmptyStateDictLoadPlanner(keys={"model"}),
        no_dist=True,
    )
    return {k: v.contiguous() for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def export_model(source: Path, out: Path, fmt: str = "safetensors") -> Path:
    """Write the consolidated model of `source` (checkpoint or run dir) to `out`."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt}: unknown; allowed: {', '.join(FORMATS)}")
    checkpoint = resolve_checkpoint(source)
    tensors = load_model_state(checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(tensors, str(out), metadata={"checkpoint": str(checkpoint)})
    else:
        torch.save(tensors, out)
    log.info("exported %d tensors from %s to %s", len(tensors), checkpoint, out)
    return out
