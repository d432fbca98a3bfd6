"""`python -m toolkit.bench.grad_sync [--repeats R] [OVERRIDE ...]`: the memory each
trainer.grad_sync mode costs, measured against the performance model's term.

Runs the same job (default: 2 ranks of gpt_125m, 4 micro-steps) with grad_sync=last and
grad_sync=every, interleaved, R times each, through the normal launcher; reads each run's
peak memory per rank (the step records' mem_peak_bytes: ru_maxrss on CPU,
max_memory_allocated on GPU) and prints the medians, their difference, and beside it the
difference the performance model predicts (toolkit.perfmodel: accumulated_grads_bytes and
the peak). The baseline is that prediction: last holds every unit's unsharded gradient in
the reduce dtype, every only the fp32 shard.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULTS = [
    "model=gpt_125m",
    "cluster.tasks_per_node=2",
    "trainer.grad_accum=4",
    "trainer.micro_batch_size=1",
    "trainer.steps=2",
    "trainer.log_every=1",
    "trainer.progress=false",
    "data.seq_len=64",
    "checkpoint.enabled=false",
]
MODES = ("last", "every")


def peak_bytes(run_dir: Path) -> int:
    """The largest per-step peak any rank recorded."""
    peaks = [
        json.loads(line)["mem_peak_bytes"]
        for path in sorted((run_dir / "metrics").glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return max(peaks)


def predicted(overrides: list[str], mode: str) -> dict[str, float]:
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.perfmodel import predict_job

    m = predict_job(to_job(compose_raw([*overrides, f"trainer.grad_sync={mode}"]))).memory
    return {"accumulated": m["accumulated_grads_bytes"], "peak": m["peak_bytes"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.grad_sync")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, interleaved")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    overrides = [*DEFAULTS, *args.overrides]
    measured: dict[str, list[int]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for mode in MODES:
                run = Path(tmp) / f"{mode}{r}"
                cmd = [sys.executable, "-m", "toolkit.launch", *overrides]
                cmd += [f"trainer.grad_sync={mode}", f"hydra.run.dir={run}"]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stderr[-2000:], file=sys.stderr)
                    return done.returncode
                measured[mode].append(peak_bytes(run))
                print(f"{mode} run {r}: peak {measured[mode][-1] / 2**20:,.1f} MiB", flush=True)
    model = {m: predicted(overrides, m) for m in MODES}
    median = {m: statistics.median(measured[m]) for m in MODES}
    mib = 2**20
    for m in MODES:
        print(
            f"{m}: measured peak median {median[m] / mib:,.1f} MiB; model peak "
            f"{model[m]['peak'] / mib:,.1f} MiB, accumulated gradients "
            f"{model[m]['accumulated'] / mib:,.1f} MiB"
        )
    out = {
        "measured_last_minus_every_bytes": median["last"] - median["every"],
        "model_peak_last_minus_every_bytes": model["last"]["peak"] - model["every"]["peak"],
        "model_accumulated_last_minus_every_bytes": model["last"]["accumulated"]
        - model["every"]["accumulated"],
        "measured_ratio_last_over_every": median["last"] / median["every"],
        "repeats": args.repeats,
    }
    print(
        f"last - every: measured {out['measured_last_minus_every_bytes'] / mib:,.1f} MiB, "
        f"model {out['model_peak_last_minus_every_bytes'] / mib:,.1f} MiB (peak), "
        f"{out['model_accumulated_last_minus_every_bytes'] / mib:,.1f} MiB (accumulated)"
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
