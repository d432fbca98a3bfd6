"""Export a checkpoint's model as one file for inference (the same as `toolkit export`).

python scripts/export_model.py RUN_DIR_OR_CHECKPOINT OUT [--format safetensors|torch]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.cli.export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
