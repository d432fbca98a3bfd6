"""Export a checkpoint's model as one file for inference.

python scripts/export_model.py RUN_DIR_OR_CHECKPOINT OUT [--format safetensors|torch]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.checkpoint.export import FORMATS, export_model  # noqa: E402
from toolkit.checkpoint.manifest import CheckpointCorrupt, CheckpointTooNew  # noqa: E402
from toolkit.checkpoint.trust import UnsafeCheckpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    sys.exit(main())
