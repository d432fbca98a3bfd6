"""CPU benchmark: wall and CPU seconds per GB of each piece of a save.

python -m toolkit.bench.checkpoint cpu [--gb 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from toolkit.bench.checkpoint.shared import cpu_seconds, raw_write


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Wall and CPU seconds per piece of a save, for `--gb` of fp32 tensors in one process:
    DCP's writer with and without torch.save's zip CRC-32, the toolkit's writer (no CRC,
    checksums while writing) through the page cache and with O_DIRECT, a plain write of the
    same bytes (the baseline), and read-back checksums with sha256 (format 1) and xxh3-128
    (format 2). CPU is this thread's and the whole machine's busy time (which also catches
    the kernel's writeback threads; run it on an idle machine). Repetitions interleaved,
    medians reported."""
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.utils.serialization
    from torch.distributed.checkpoint import FileSystemWriter

    from toolkit.checkpoint.manifest import checksum_file
    from toolkit.checkpoint.storage import LocalStorage

    per = 1_700_000  # ~6.8 MB per tensor, like the blocks of gpt_125m and their AdamW state
    count = max(1, int(args.gb * 1e9 / (per * 4)))
    tensors = {f"t{i}": torch.randn(per) for i in range(count)}
    nbytes = count * per * 4
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-cpu-", dir=args.dir))
    config = torch.utils.serialization.config.save

    def dcp_write(crc: bool) -> None:
        config.compute_crc32 = crc
        try:
            writer = FileSystemWriter(root / "dcp", single_file_per_rank=True, sync_files=True)
            dcp.save(tensors, storage_writer=writer, no_dist=True)
        finally:
            config.compute_crc32 = True

    def shard_write(direct: bool) -> None:
        dcp.save(
            tensors, storage_writer=LocalStorage(direct).dcp_writer(root / "dcp"), no_dist=True
        )

    def plain_write() -> None:  # baseline: the same bytes, plain writes + fsync
        raw_write(list(tensors.values()), root / "plain.bin")

    pieces = {
        "DCP write, zip CRC-32 on (torch default)": lambda: dcp_write(True),
        "DCP write, zip CRC-32 off": lambda: dcp_write(False),
        "toolkit writer, page cache (direct_io=false)": lambda: shard_write(False),
        "toolkit writer, O_DIRECT (direct_io=true)": lambda: shard_write(True),
        "plain write + fsync (baseline)": plain_write,
        "read-back sha256 (manifest format 1)": lambda: checksum_file(root / "plain.bin", "sha256"),
        "read-back xxh3-128 (manifest format 2)": lambda: checksum_file(
            root / "plain.bin", "xxh3_128"
        ),
    }
    samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in pieces}
    try:
        plain_write()
        for _ in range(args.reps):
            for name, fn in pieces.items():
                shutil.rmtree(root / "dcp", ignore_errors=True)
                m0 = _busy(cpu_seconds())
                w0, c0 = time.perf_counter(), time.thread_time()
                fn()
                wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                samples[name].append((wall, cpu, _busy(cpu_seconds()) - m0))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    gb = nbytes / 1e9
    for name, s in samples.items():
        wall, cpu, machine = (statistics.median(x[i] for x in s) for i in range(3))
        rows.append(
            {
                "piece": name,
                "GB": gb,
                "wall_s_per_GB": wall / gb,
                "cpu_s_per_GB": cpu / gb,
                "machine_cpu_s_per_GB": machine / gb,
            }
        )
        print(
            f"{name:45s} wall {wall / gb:.2f} s/GB  CPU {cpu / gb:.2f} s/GB  "
            f"machine CPU {machine / gb:.2f} s/GB",
            flush=True,
        )
    return rows


def _busy(cpu: dict[str, float]) -> float:
    """Machine-wide busy CPU seconds (idle, iowait and steal excluded)."""
    return sum(cpu[k] for k in ("user", "nice", "system", "irq", "softirq"))
