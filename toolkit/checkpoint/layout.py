"""Names on disk: RUN_DIR/checkpoints/step-<zero-padded N>[.tmp]. Pure functions."""

from __future__ import annotations

import re
from pathlib import Path

STEP_DIGITS = 8
TMP_SUFFIX = ".tmp"
MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"  # rank 0: step, tokens, scheduler, loader, config hash
CONFIG = "config.json"  # the resolved job config the checkpoint was written with
RNG_DIR = "rng"  # rng/rank<k>.json: every rank's RNG states
_NAME = re.compile(r"step-(\d+)")
_TMP = re.compile(r"step-(\d+)\.tmp")


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def step_name(step: int) -> str:
    return f"step-{step:0{STEP_DIGITS}d}"


def committed_path(root: Path, step: int) -> Path:
    return root / step_name(step)


def tmp_path(root: Path, step: int) -> Path:
    return root / (step_name(step) + TMP_SUFFIX)


def parse_step(name: str) -> int | None:
    """The step of a committed checkpoint directory name, None for anything else."""
    m = _NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def parse_tmp_step(name: str) -> int | None:
    m = _TMP.fullmatch(name)
    return int(m.group(1)) if m else None


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank{rank}.json"
