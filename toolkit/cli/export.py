"""`toolkit export RUN_DIR_OR_CHECKPOINT OUT [--format auto|safetensors|torch|hf]`: a
checkpoint's model as one file for inference, or a Hugging Face model's as a directory that
transformers' from_pretrained loads (also scripts/export_model.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from toolkit.checkpoint.export import FORMATS, export_model, load_model_state, resolve_checkpoint
from toolkit.checkpoint.layout import CONFIG, checkpoints_dir
from toolkit.checkpoint.manifest import CheckpointCorrupt, CheckpointTooNew
from toolkit.checkpoint.trust import UnsafeCheckpoint
from toolkit.config.compose import group_config
from toolkit.config.model import HFModelConfig
from toolkit.errors import UserError
from toolkit.redact import REDACTED


def checkpoint_hf_model(checkpoint: Path) -> HFModelConfig | None:
    """The Hugging Face model config a checkpoint was written with, read as data (typed by
    HFModelConfig's schema, nothing instantiated); None for another kind of model. From
    the run's config.yaml where the checkpoint sits in its run dir, else from the
    checkpoint's own config.json, which is redacted (a field hidden there is refused)."""
    run_config = checkpoint.parent.parent / "config.yaml"
    if checkpoint.parent.name == checkpoints_dir(Path()).name and run_config.is_file():
        node = OmegaConf.to_container(OmegaConf.load(run_config))["model"]
    else:
        node = json.loads((checkpoint / CONFIG).read_text())["model"]
    if not isinstance(node, dict) or node.get("kind") != HFModelConfig.kind:
        return None
    typed = group_config("model", node)
    if not isinstance(typed, HFModelConfig):
        return None
    hidden = sorted(k for k, v in typed.config.items() if v == REDACTED)
    if hidden:
        raise ValueError(
            f"{checkpoint}: its model.config has redacted values ({', '.join(hidden)}) and "
            "no run config.yaml beside it; export from the run directory"
        )
    return typed


def export_hf(source: Path, out: Path, fmt: str) -> Path | None:
    """A Hugging Face model's run (fmt auto or hf) as a directory that transformers'
    from_pretrained loads (toolkit.train.models.hf.save_pretrained); None where fmt is auto
    and the model is not one (then one file), ValueError where fmt is hf."""
    if fmt not in ("auto", "hf"):
        return None
    checkpoint = resolve_checkpoint(source)
    model = checkpoint_hf_model(checkpoint)
    if model is None and fmt == "hf":
        raise ValueError(f"--format hf: {checkpoint} holds no Hugging Face model")
    if model is None:
        return None
    if out.expanduser().resolve().is_relative_to(source.expanduser().resolve()):
        raise ValueError(f"{out}: inside {source}; write the export to a new directory")
    from toolkit.train.models.hf import save_pretrained  # transformers: the hf extra

    return save_pretrained(model, load_model_state(checkpoint), out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="toolkit export", description="Export a checkpoint's model as one file for inference."
    )
    parser.add_argument(
        "source",
        type=Path,
        help="a run directory (its latest checkpoint) or a checkpoint directory",
    )
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--format",
        choices=("auto", *FORMATS, "hf"),
        default="auto",
        help="auto (default): a Hugging Face model's run as a from_pretrained directory "
        "(hf: config.json and model.safetensors), any other model as one safetensors file",
    )
    parser.add_argument(
        "--member",
        help="an ensemble's run (trainer.ensemble): export this member alone, as the plain "
        "model (its name, e.g. m03, under RUN/members/)",
    )
    args = parser.parse_args(argv)
    try:
        path = None if args.member else export_hf(args.source, args.out, args.format)
        if path is None:
            fmt = "safetensors" if args.format == "auto" else args.format
            path = export_model(args.source, args.out, fmt, args.member)
    except (
        CheckpointCorrupt,
        CheckpointTooNew,
        UnsafeCheckpoint,
        UserError,
        FileNotFoundError,
        ValueError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
