"""Consolidate a sharded checkpoint's model weights into one file for inference, in one
process (no process group): safetensors by default, or torch.save."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from toolkit.checkpoint.layout import checkpoints_dir
from toolkit.checkpoint.manifest import CheckpointCorrupt, verify
from toolkit.checkpoint.resume import latest_valid
from toolkit.checkpoint.storage import LocalStorage, SafeFileSystemReader
from toolkit.checkpoint.trust import SafeLoadPlanner, first_unsafe
from toolkit.config.trainer import MEMBER_NAME

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
    # Empty tensors of the full shapes the metadata records; DCP fills them from every
    # rank's shards (as PyTorch's dcp_to_torch_save, through public API only).
    reader = SafeFileSystemReader(checkpoint)
    model = {
        fqn.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for fqn, meta in reader.read_metadata().state_dict_metadata.items()
        if fqn.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    state = {"model": model}
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(checkpoint))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - re-raised
        unsafe = first_unsafe(exc)
        if unsafe is not None:
            raise unsafe from None
        raise
    return {k: v.contiguous() for k, v in state["model"].items()}


def refuse_overwrite(source: Path, out: Path) -> None:
    """An export never replaces a file of the run or checkpoint it reads (its config.yaml,
    a shard, ...) nor a directory; ValueError (one line) naming `out` otherwise."""
    source, target = source.expanduser().resolve(), out.expanduser().resolve()
    if target.is_dir():
        raise ValueError(f"{out}: is a directory; give the path of the file to write")
    if target.exists() and target.is_relative_to(source):
        raise ValueError(
            f"{out}: a file of {source} already, which an export never overwrites; "
            "write the export to a new path"
        )


def member_tensors(
    tensors: dict[str, torch.Tensor], checkpoint: Path, member: str
) -> dict[str, torch.Tensor]:
    """One ensemble member's slice of a checkpoint's stacked [K, ...] tensors: the plain
    model's state dict. The member's index is read (as JSON) from the run's
    members/<name>/member.json (toolkit.train.ensemble_members)."""
    if not MEMBER_NAME.fullmatch(member):
        raise ValueError(f"--member={member!r}: not a member name (letters, digits, . _ -)")
    members = checkpoint.parent.parent / "members"
    path = members / member / "member.json"
    if not path.is_file():
        known = sorted(p.name for p in members.iterdir()) if members.is_dir() else []
        raise ValueError(
            f"--member={member}: no such member of {checkpoint.parent.parent}"
            + (f"; its members: {', '.join(known)}" if known else " (not an ensemble's run)")
        )
    index = json.loads(path.read_text())["index"]
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"{path}: index={index!r} is not a member's index")
    return {k: v[index].contiguous() for k, v in tensors.items()}


def export_model(
    source: Path, out: Path, fmt: str = "safetensors", member: str | None = None
) -> Path:
    """Write the consolidated model of `source` (checkpoint or run dir) to `out`; `member`:
    one member of an ensemble's run (its slice of the stacked tensors, the plain model)."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt}: unknown; allowed: {', '.join(FORMATS)}")
    refuse_overwrite(source, out)
    checkpoint = resolve_checkpoint(source)
    members = checkpoint.parent.parent / "members"
    if member is None and members.is_dir():  # stacked [K, ...] tensors fit no plain model
        names = sorted(p.name for p in members.iterdir() if (p / "member.json").is_file())
        raise ValueError(
            f"{source}: an ensemble's run (trainer.ensemble={len(names)}), its tensors stacked "
            f"over the members; export one with --member NAME ({', '.join(names)})"
        )
    tensors = load_model_state(checkpoint)
    if member is not None:  # trainer.ensemble: one member as the plain model
        tensors = member_tensors(tensors, checkpoint, member)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(tensors, str(out), metadata={"checkpoint": str(checkpoint)})
    else:
        torch.save(tensors, out)
    log.info("exported %d tensors from %s to %s", len(tensors), checkpoint, out)
    return out
