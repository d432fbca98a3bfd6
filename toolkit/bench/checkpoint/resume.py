"""Resume benchmark: time from job start to the first resumed step as checkpoints grow.

python -m toolkit.bench.checkpoint resume [--models gpt_tiny,gpt_small,gpt_125m]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _launch(run_dir: Path, overrides: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [
        sys.executable,
        "-m",
        "toolkit.launch",
        *overrides,
        f"hydra.run.dir={run_dir}",
        "launch.follow=false",
    ]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return t0, done


def _first_step_wall(run_dir: Path, step: int) -> float:
    for line in (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["step"] == step:
            return rec["wall_time"] - rec["step_time_s"]  # when the step began
    raise LookupError(step)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="gpt_tiny,gpt_small,gpt_125m")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for model in args.models.split(","):
        base = [
            f"model={model}",
            "data=synthetic",
            f"data.seq_len={args.seq_len}",
            "trainer.global_batch_size=2",
            "checkpoint.enabled=true",
            "trainer.eval_batches=0",
            "trainer.progress=false",
        ]
        for rep in range(args.reps):
            tmp = Path(tempfile.mkdtemp(prefix="bench-resume-", dir=args.dir))
            try:
                t_fresh, _ = _launch(tmp / "run", [*base, "trainer.steps=1"])
                fresh = _first_step_wall(tmp / "run", 1) - t_fresh
                t_res, _ = _launch(tmp / "run", [*base, "trainer.steps=2"])
                resumed = _first_step_wall(tmp / "run", 2) - t_res
                events = [
                    json.loads(x)
                    for x in (tmp / "run" / "metrics" / "events-rank0.jsonl")
                    .read_text()
                    .splitlines()
                ]
                restart = next(e for e in events if e["name"] == "restart")
                size = json.loads(
                    (Path(restart["attrs"]["checkpoint"]) / "manifest.json").read_text()
                )
                total = sum(f["size_bytes"] for f in size["files"].values())
                rows.append(
                    {
                        "model": model,
                        "rep": rep,
                        "checkpoint_GB": total / 1e9,
                        "fresh_start_to_first_step_s": fresh,
                        "resume_start_to_first_step_s": resumed,
                        "load_s": restart["attrs"]["load_s"],
                        "verify_s": restart["attrs"]["verify_s"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return rows
