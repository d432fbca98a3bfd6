"""Export a checkpoint's model for inference (the same as `toolkit export`): one file, or a
Hugging Face model's run as a directory that transformers' from_pretrained loads.

python scripts/export_model.py RUN_DIR_OR_CHECKPOINT OUT [--format auto|safetensors|torch|hf] [--member NAME]

Reads the checkpoint as data (tensors through an allow-listed loader; nothing of the run
directory is imported): the working directory is not on sys.path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_cwd = os.path.realpath(os.getcwd())
sys.path[:] = [p for p in sys.path if p not in ("", ".") and os.path.realpath(p) != _cwd]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.cli.export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
