"""`python -m toolkit.bench.pipeline [--reps R] [--steps N] [--warmup W] [--world K]
[--micro-batches M] [--global-batch G] [--seq-len T] [--layouts L ...]`

Pipeline bubble, step time and memory per layout, on the toolkit's own pipeline
(toolkit.train.pipeline) and FSDP2 accumulation step (toolkit.train.steps), gpt_small.

Each layout runs in fresh processes (so that a process's peak RSS is that layout's), the
layouts in rotating order over R repetitions (A B C, B C A, ...), with the same global
batch (G sequences of T tokens, M micro-batches per data-parallel rank) and random tokens.
Per step and rank it measures:

* step: the wall time of forward/backward over the micro-batches (the schedule's step, or
  the accumulation loop), clipping and the optimizer step excluded;
* compute: time inside the stage's forward_one_chunk / backward_one_chunk (FSDP's
  all-gathers inside them count here), and reduce: its perform_reduce_grad (FSDP's
  reduce-scatter after the last micro-batch);
* idle = step - compute - reduce: time the stage waited for its neighbours (the bubble,
  plus point-to-point transfer).

The baseline beside it is the schedule's formula for the bubble's share of the step,
(p-1)/(m+p-1) for GPipe and 1F1B and (p-1)/(v*m+p-1) for interleaved 1F1B with v stages
per rank (equal stages, free communication). Peak memory: the process's peak RSS
(ru_maxrss) minus its RSS before the model was built. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LAYOUTS = {
    # name: (pp, dp_shard, schedule, virtual stages)
    "pp2_dp2_1f1b": (2, 2, "1f1b", 1),
    "pp2_dp2_gpipe": (2, 2, "gpipe", 1),
    "pp2_dp2_interleaved": (2, 2, "interleaved_1f1b", 2),
    "dp4": (1, 4, "1f1b", 1),
    "pp2_1f1b": (2, 1, "1f1b", 1),
}


def bubble_formula(pp: int, micro: int, virtual: int) -> float:
    """The schedule's idle share of a step with equal stages and free communication."""
    return (pp - 1) / (virtual * micro + pp - 1) if pp > 1 else 0.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(method, totals: dict[str, float], key: str):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t0

    return wrapper


def worker(rank: int, world: int, layout: str, settings: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist

    from toolkit.config.model import GPTConfig
    from toolkit.config.parallel import MeshShape, ParallelConfig, pipeline_stages
    from toolkit.config.precision import PrecisionConfig
    from toolkit.distributed.env import discover
    from toolkit.distributed.fsdp import parallelize
    from toolkit.distributed.init import init_distributed, shutdown_distributed
    from toolkit.distributed.mesh import build_mesh, data_parallel_mesh
    from toolkit.perfmodel import balanced_split, layer_costs
    from toolkit.train.models import build_model
    from toolkit.train.pipeline import PipelineStep, build_pipeline
    from toolkit.train.steps import Accumulation

    device = init_distributed(discover(), 300.0)
    pp, dp_shard, schedule, virtual = LAYOUTS[layout]
    m, seq = settings["micro_batches"], settings["seq_len"]
    micro = settings["global_batch"] // (dp_shard * m)
    par = ParallelConfig(pp=pp, dp_shard=dp_shard, pp_schedule=schedule, pp_virtual_stages=virtual)
    shape = MeshShape(pp=pp, dp_shard=dp_shard)
    cfg = GPTConfig(name="gpt_small", num_layers=4, dim=192, num_heads=6, max_seq_len=512)
    rss_before = rss_bytes()
    torch.manual_seed(0)
    model = build_model(cfg)
    model.reset_parameters()
    mesh = build_mesh(shape, device.type)
    totals = {"compute": 0.0, "reduce": 0.0}
    if pp > 1:
        split = balanced_split(layer_costs(cfg, seq), pipeline_stages(par))
        pipe = build_pipeline(model, mesh, shape, par, PrecisionConfig(), split)
        model = pipe.model
        strategy = PipelineStep(pipe, schedule, device, model.loss, world // pp)
        for stage in strategy.stages:
            stage.forward_one_chunk = timed(stage.forward_one_chunk, totals, "compute")
            stage.backward_one_chunk = timed(stage.backward_one_chunk, totals, "compute")
            stage.perform_reduce_grad = timed(stage.perform_reduce_grad, totals, "reduce")
    else:
        model = parallelize(model, data_parallel_mesh(mesh, shape), par, PrecisionConfig())
        strategy = Accumulation(model, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dp_rank = shape.dp_rank(rank)
    gen = torch.Generator().manual_seed(1 + dp_rank)
    rows = []
    for step in range(settings["warmup"] + settings["steps"]):
        batches = []
        for _ in range(m):
            tokens = torch.randint(0, cfg.vocab_size, (micro, seq + 1), generator=gen)
            batches.append((tokens[:, :-1], tokens[:, 1:]))
        dist.barrier()
        totals.update(compute=0.0, reduce=0.0)
        t0 = time.perf_counter()
        strategy.forward_backward(batches)
        step_s = time.perf_counter() - t0
        strategy.clip_grad_norm(1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= settings["warmup"]:
            rows.append({"step_s": step_s, **totals})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    record = {
        "rank": rank,
        "stage": shape.coords(rank)["pp"],
        "step_s": statistics.median(r["step_s"] for r in rows),
        "compute_s": statistics.median(r["compute"] for r in rows),
        "reduce_s": statistics.median(r["reduce"] for r in rows),
        "idle_share": statistics.median(
            max(0.0, r["step_s"] - r["compute"] - r["reduce"]) / r["step_s"] for r in rows
        ),
        "peak_rss_over_start_bytes": peak,
    }
    Path(out, f"{layout}-rank{rank}.json").write_text(json.dumps(record))
    shutdown_distributed()


def summarise(layout: str, ranks: list[dict], m: int) -> dict[str, Any]:
    pp, dp_shard, schedule, virtual = LAYOUTS[layout]
    out: dict[str, Any] = {
        "step_s": max(r["step_s"] for r in ranks),  # the step ends with the slowest rank
        "peak_rss_over_start_mib": max(r["peak_rss_over_start_bytes"] for r in ranks) / 2**20,
    }
    if pp > 1:
        out["bubble_formula"] = bubble_formula(pp, m, virtual)
        out["idle_share_by_stage"] = [
            statistics.mean(r["idle_share"] for r in ranks if r["stage"] == s) for s in range(pp)
        ]
        out["compute_s_by_stage"] = [
            statistics.mean(r["compute_s"] for r in ranks if r["stage"] == s) for s in range(pp)
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m toolkit.bench.pipeline")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS)[:4], choices=list(LAYOUTS))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    problems = [
        f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= {low}"
        for name, low in (("reps", 1), ("steps", 1), ("warmup", 1), ("micro_batches", 1))
        if getattr(args, name) < low
    ]
    for layout in args.layouts:
        _, dp_shard, _, _ = LAYOUTS[layout]
        if args.global_batch % (dp_shard * args.micro_batches):
            problems.append(
                f"--global-batch={args.global_batch}: must split over {dp_shard} dp ranks x "
                f"{args.micro_batches} micro-batches ({layout})"
            )
    if problems:
        print("\n".join(f"error: {line}" for line in problems), file=sys.stderr)
        return 2
    from toolkit.bench.ranks import run_ranks

    out = (args.out or Path(tempfile.mkdtemp(prefix="pipeline-bench-"))).resolve()
    settings = {
        "steps": args.steps,
        "warmup": args.warmup,
        "micro_batches": args.micro_batches,
        "global_batch": args.global_batch,
        "seq_len": args.seq_len,
    }
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    reps: dict[str, list[dict]] = {name: [] for name in args.layouts}
    for rep in range(args.reps):
        order = args.layouts[rep % len(args.layouts) :] + args.layouts[: rep % len(args.layouts)]
        for layout in order:
            pp, dp_shard, _, _ = LAYOUTS[layout]
            run_dir = out / f"rep{rep}"
            run_dir.mkdir(parents=True, exist_ok=True)
            run_ranks(worker, pp * dp_shard, run_dir, layout, settings, str(run_dir))
            ranks = [
                json.loads((run_dir / f"{layout}-rank{r}.json").read_text())
                for r in range(pp * dp_shard)
            ]
            reps[layout].append(summarise(layout, ranks, args.micro_batches))
    result: dict[str, Any] = {"settings": settings, "out": str(out), "layouts": {}}
    for layout, rows in reps.items():
        med = {
            "step_s_median": statistics.median(r["step_s"] for r in rows),
            "step_s_min_max": [min(r["step_s"] for r in rows), max(r["step_s"] for r in rows)],
            "peak_rss_over_start_mib_median": statistics.median(
                r["peak_rss_over_start_mib"] for r in rows
            ),
        }
        if "bubble_formula" in rows[0]:
            stages = len(rows[0]["idle_share_by_stage"])
            med["bubble_formula"] = rows[0]["bubble_formula"]
            med["idle_share_by_stage_median"] = [
                statistics.median(r["idle_share_by_stage"][s] for r in rows) for s in range(stages)
            ]
            med["compute_s_by_stage_median"] = [
                statistics.median(r["compute_s_by_stage"][s] for r in rows) for s in range(stages)
            ]
        result["layouts"][layout] = med
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
