"""`toolkit export RUN_DIR_OR_CHECKPOINT OUT [--format safetensors|torch]`: a checkpoint's
model as one file for inference (also scripts/export_model.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.checkpoint.export import FORMATS, export_model
from toolkit.checkpoint.manifest import CheckpointCorrupt, CheckpointTooNew
from toolkit.checkpoint.trust import UnsafeCheckpoint


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
    parser.add_argument("--format", choices=FORMATS, default="safetensors")
    args = parser.parse_args(argv)
    try:
        path = export_model(args.source, args.out, args.format)
    except (
        CheckpointCorrupt,
        CheckpointTooNew,
        UnsafeCheckpoint,
        FileNotFoundError,
        ValueError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
