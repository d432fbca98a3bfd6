"""`task=bench_collectives`: the collective sweep on every rank, the report on rank 0.

The measurement and the report live in toolkit.bench (collectives, collectives_report);
this task composes them for one run and fails it on wrong results or slow links.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from toolkit.collectives.busbw import sweep_sizes
from toolkit.collectives.measure import max_bytes, measure, verdict
from toolkit.collectives.report import (
    H5_NAME,
    TABLE_NAME,
    Row,
    format_row,
    format_table,
    op_footer,
    op_header,
    write_h5,
)
from toolkit.config.collectives import CollectivesConfig

log = logging.getLogger("toolkit.bench.collectives")


def run_attrs(job, env, device: torch.device) -> dict:
    from toolkit.nccl import effective_env

    cfg = job.collectives
    nccl_version = None
    if device.type == "cuda":
        version = torch.cuda.nccl.version()
        nccl_version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {
        "world_size": env.world_size,
        "num_nodes": env.num_nodes,
        "backend": dist.get_backend(),
        "device": str(device),
        "hostname": socket.gethostname(),
        "dtype": cfg.dtype,
        "redop": cfg.redop,
        "iters": cfg.iters,
        "warmup_iters": cfg.warmup_iters,
        "time_reduce": cfg.time_reduce,
        "torch_version": torch.__version__,
        "nccl_version": nccl_version or "",
        "nccl_profile": job.nccl.profile,
        "nccl_env": effective_env(),
        "created_unix_s": time.time(),
    }


def run(job, env, run_dir: Path, device: torch.device) -> list[Row]:
    """The task: sweep, report (rank 0), then fail on wrong results or slow links."""
    cfg: CollectivesConfig = job.collectives
    baseline = None
    if cfg.compare_baseline:
        from toolkit.collectives.baseline import minimal_loop

        baseline = minimal_loop
    top = max_bytes(cfg, device, env.local_world_size)
    sizes = sweep_sizes(cfg.min_bytes, top, cfg.step_factor)
    title = (
        f"bench_collectives: {env.world_size} ranks on {env.num_nodes} node(s), "
        f"{dist.get_backend()}, {cfg.dtype}, warmup {cfg.warmup_iters}, iters {cfg.iters}, "
        f"time {cfg.time_reduce} over ranks"
    )
    # Rank 0 prints each row as it is measured (a GPU sweep to 1 GiB takes minutes).
    say = (lambda line: print(line, flush=True)) if env.is_rank0 else (lambda line: None)
    say(f"# {title}")
    rows: list[Row] = []
    for op in cfg.ops:
        for line in op_header(op, cfg.compare_baseline):
            say(line)
        op_rows = []
        for size in sizes:
            row = measure(cfg, op, size, device, baseline)
            if row is not None:
                op_rows.append(row)
                say(format_row(row, cfg.compare_baseline))
        for line in op_footer(op, op_rows):
            say(line)
        rows += op_rows
    if env.is_rank0:
        table = format_table(rows, list(cfg.ops), cfg.compare_baseline, title)
        say(table.splitlines()[-1])
        (run_dir / TABLE_NAME).write_text(table + "\n")
        write_h5(run_dir / H5_NAME, rows, run_attrs(job, env, device))
        log.info("collectives: table and HDF5 written to %s", run_dir)
    dist.barrier()
    failures = verdict(cfg, rows)
    if failures:
        code, lines = failures
        for line in lines:
            log.error("%s", line)
            if env.is_rank0:
                print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(code)
    return rows
