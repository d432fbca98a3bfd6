"""Compile Triton kernels for a real GPU (sm_90: H100/H200) down to cubins, with no GPU here:
a script run in a subprocess with the interpreter off (triton.jit reads TRITON_INTERPRET when
the kernel modules are imported) and a fresh Triton cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])


def compile_for_sm90(script: str, cache: Path) -> str:
    """Run `script` (which compiles kernels and prints a count); its stdout."""
    env = dict(os.environ, PYTHONPATH=REPO, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(cache))
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
