"""The GPU check's data step (scripts/gpu_check.sh): the market's samples cut on the GPU
(toolkit.data.device) equal the host loader's bitwise, resident and streamed in chunks
(page-locked host buffers, the copy on a side stream, the training stream waiting on its
event), and `toolkit bench data --paths` gives their samples/s beside the host loader's
and a plain gather's; and tables that fit the budget but no longer the GPU's memory (taken
by a filler tensor) are streamed, with the same batches, instead of failing. Runs on the CPU
too (the same arithmetic, no copies; not the memory part): its test."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

NUM_TIMES = 4000
NUM_INSTRUMENTS = 16
STEPS = 12  # over 4 chunks of 3 steps when streamed


def same_batches(a: list, b: list) -> bool:
    return all(
        x.shape == y.shape and torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0))
        for (ax, ay), (bx, by) in zip(a, b, strict=True)
        for x, y in ((ax, bx), (ay, by))
    )


def data_step(
    out: Path, device: torch.device, num_times: int = NUM_TIMES, bench: bool = True
) -> dict[str, Any]:
    from toolkit.config.data import DataConfig
    from toolkit.data.device import MarketDeviceLoader, market_loaders
    from toolkit.data.loader import SamplePlan, build_loaders
    from toolkit.data.synthetic import write_synthetic

    started = time.perf_counter()
    n = NUM_INSTRUMENTS
    path = out / "market"
    write_synthetic(path, num_times, n, "npy", chunk_len=256)
    cfg = DataConfig(
        kind="returns", path=str(path), seq_len=64, horizon=2, num_workers=0, val_fraction=0.1
    )
    plan = SamplePlan(seed=0, seq_len=64, micro_batch_size=64, grad_accum=2, world_size=1, rank=0)
    pin = device.type == "cuda"
    host, _ = build_loaders(cfg, plan, 3 * n, n, pin)
    resident, _, placement = market_loaders(cfg, plan, 3 * n, n, device, pin)
    streamed = MarketDeviceLoader(resident.windows, plan, device, steps_per_chunk=3)
    equal = {"resident": True, "streamed": True}
    on_device = True
    for _ in range(STEPS):
        want = [(x.to(device), y.to(device)) for x, y in next(host)[1]]
        for name, loader in (("resident", resident), ("streamed", streamed)):
            got = next(loader)[1]
            on_device &= all(x.device.type == device.type for x, _ in got)
            equal[name] &= same_batches(got, want)
    copied = streamed._stream.bytes_copied if streamed._stream is not None else 0
    for loader in (host, resident, streamed):
        loader.close()
    result: dict[str, Any] = {
        "placement": placement.line,
        "bitwise_equal": equal,
        "batches_on_device": on_device,
        "streamed_bytes_copied": copied,
    }
    if device.type == "cuda":
        result["out_of_memory"] = out_of_memory_streams(out, device)
    if bench:
        report = out / "paths.json"
        command = [sys.executable, "-m", "toolkit.bench.data", "--paths", "--repeats", "3"]
        command += ["--formats", "npy", "--workers", "0", "--dir", str(out), "--json", str(report)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        paths = json.loads(report.read_text())["paths"] if done.returncode == 0 else None
        result["paths"] = paths or {"error": done.stderr[-2000:]}
    memory_ok = result.get("out_of_memory", {"ok": True})["ok"]
    paths_ok = "error" not in result.get("paths", {})
    result["ok"] = all(equal.values()) and on_device and copied > 0 and paths_ok and memory_ok
    result["seconds"] = time.perf_counter() - started
    return result


def out_of_memory_streams(out: Path, device: torch.device) -> dict[str, Any]:
    """61 MiB of tables within a 4 GiB budget (so: resident), but a filler tensor leaves the
    GPU 32 MiB or so: the loader streams instead of failing, and its batches are still the
    host loader's."""
    from toolkit.config.data import DataConfig
    from toolkit.data.device import MiB, market_loaders
    from toolkit.data.loader import SamplePlan, build_loaders
    from toolkit.data.synthetic import write_synthetic

    n = 200
    path = write_synthetic(out / "wide", 20_000, n, "npy", chunk_len=256) and out / "wide"
    cfg = DataConfig(
        kind="returns",
        path=str(path),
        seq_len=64,
        num_workers=0,
        val_fraction=0.1,
        device_budget_mib=4096,
    )
    plan = SamplePlan(seed=0, seq_len=64, micro_batch_size=8, grad_accum=1, world_size=1, rank=0)
    host, _ = build_loaders(cfg, plan, 3 * n, n, True)
    loader, _, placement = market_loaders(cfg, plan, 3 * n, n, device, True)
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(device)[0]
    filler, margin = None, None
    for margin_mib in (32, 64, 128, 256):
        try:
            filler = torch.empty(free - margin_mib * MiB, dtype=torch.uint8, device=device)
            margin = margin_mib
            break
        except torch.cuda.OutOfMemoryError:
            continue
    error = None
    try:
        equal = True
        for _ in range(6):
            want = [(x.to(device), y.to(device)) for x, y in next(host)[1]]
            equal &= same_batches(next(loader)[1], want)
        streamed = not loader.resident
    except torch.cuda.OutOfMemoryError as exc:
        equal, streamed, error = False, False, str(exc).splitlines()[0]
    finally:
        host.close()
        loader.close()
        del filler
        torch.cuda.empty_cache()
    return {
        "placement": placement.line,
        "filler_margin_mib": margin,
        "streamed": streamed,
        "bitwise_equal": equal,
        "error": error,
        "ok": equal and streamed,
    }
