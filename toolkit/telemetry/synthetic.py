"""Synthetic node files for tests and benchmarks: N nodes x G GPUs of a data-parallel job,
written with the real writer, with faults planted where the caller says (a straggler rank,
a job-wide idle gap, a preemption and restart). Values are shaped like an H100 node's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from toolkit.telemetry.h5store import NodeFileWriter
from toolkit.telemetry.schema import (
    CHECKPOINT,
    PREEMPTION,
    RESTART,
    TIME,
    Column,
    TableSpec,
    events_spec,
    node_file_name,
    steps_spec,
    telemetry_dir,
)
from toolkit.telemetry.sources.host import HOST_COLUMNS, NET_COLUMNS
from toolkit.telemetry.sources.infiniband import COUNTERS, RATES, UNITS
from toolkit.telemetry.sources.nvml import COLUMNS as GPU_COLUMNS

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC


@dataclass
class Plan:
    nodes: int = 8
    gpus_per_node: int = 8
    duration_s: float = 3600.0
    interval_s: float = 1.0
    step_time_s: float = 0.5
    straggler_rank: int | None = 13
    straggler_slowdown: float = 0.15
    idle_gap_at_s: float | None = 1500.0  # all ranks pause, no event explains it
    idle_gap_s: float = 90.0
    checkpoint_every_s: float = 600.0
    checkpoint_stall_s: float = 4.0
    restart_at_s: float | None = None  # preemption here, attempt 1 resumes after downtime
    restart_downtime_s: float = 60.0
    ib_ports: int = 4
    seed: int = 0
    job_id: str = "4242"
    files: list[Path] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def _step_times(plan: Plan, rng: np.random.Generator, n: int, rank: int) -> np.ndarray:
    base = plan.step_time_s * rng.lognormal(0.0, 0.02, n)
    if rank == plan.straggler_rank:
        base *= 1.0 + plan.straggler_slowdown
    return base


def _pauses(plan: Plan) -> list[tuple[float, float, str]]:
    """(start offset s, length s, kind) of every stop in the step stream."""
    pauses = []
    t = plan.checkpoint_every_s
    while t < plan.duration_s:
        pauses.append((t, plan.checkpoint_stall_s, CHECKPOINT))
        t += plan.checkpoint_every_s
    if plan.idle_gap_at_s is not None:
        pauses.append((plan.idle_gap_at_s, plan.idle_gap_s, "idle"))
    if plan.restart_at_s is not None:
        pauses.append((plan.restart_at_s, plan.restart_downtime_s, RESTART))
    return sorted(pauses)


def _clock(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The job's step clock, shared by all ranks: (step starts, step durations), at the
    slowest rank's pace, with the pauses inserted."""
    clock_rng = np.random.default_rng(plan.seed)
    n_max = int(plan.duration_s / plan.step_time_s) + 10
    slow = plan.step_time_s * (1 + (plan.straggler_slowdown if plan.straggler_rank else 0))
    durations_clock = slow * clock_rng.lognormal(0.0, 0.01, n_max)
    starts = np.concatenate([[0.0], np.cumsum(durations_clock)[:-1]])
    for at, length, _kind in _pauses(plan):
        starts[starts >= at] += length
    keep = starts + durations_clock < plan.duration_s
    return starts[keep], durations_clock[: int(keep.sum())]


def _rank_steps(
    plan: Plan, rank: int, clock: tuple[np.ndarray, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Steps of one rank: times from the job's step clock (all ranks share step starts,
    as in synchronous training), durations of its own."""
    rng = np.random.default_rng(plan.seed * 1000 + rank)
    starts, durations_clock = clock if clock is not None else _clock(plan)
    n = len(starts)
    step_time = np.minimum(_step_times(plan, rng, n, rank), durations_clock[:n])
    data_wait = step_time * rng.uniform(0.01, 0.03, n)
    optimizer = step_time * 0.08
    fwd_bwd = step_time - data_wait - optimizer
    tokens = 8 * 4096 * plan.world_size
    tps = tokens / step_time
    steps = np.arange(1, n + 1)
    return {
        "step": steps,
        "wall_time": T0 + starts + step_time,
        "step_time_s": step_time,
        "data_wait_s": data_wait,
        "forward_backward_s": fwd_bwd,
        "optimizer_s": optimizer,
        "loss": 2.0 + 8.0 * np.exp(-steps / 2000.0) + rng.normal(0, 0.02, n),
        "grad_norm": 1.0 + rng.normal(0, 0.1, n),
        "lr": np.full(n, 3e-4),
        "tokens": np.full(n, tokens),
        "tokens_per_s": tps,
        "mfu": tps * 6 * 1.1e9 / (plan.world_size * 989e12),
        "mem_peak_bytes": np.full(n, 62 << 30),
        # The step's split (toolkit.events.StepRecord): a fifth of forward/backward waits in
        # collectives that ran for twice that long.
        "compute_s": 0.8 * fwd_bwd,
        "comm_exposed_s": 0.2 * fwd_bwd,
        "optimizer_step_s": optimizer,
        "checkpoint_stall_s": np.zeros(n),
        "other_s": np.zeros(n),
        "comm_all_gather_s": 0.25 * fwd_bwd,
        "comm_reduce_scatter_s": 0.15 * fwd_bwd,
        "comm_all_reduce_s": np.full(n, 0.002),
        "comm_p2p_s": np.zeros(n),
    }


def _busy_mask(plan: Plan, times: np.ndarray) -> np.ndarray:
    busy = np.ones(len(times), dtype=bool)
    for at, length, _kind in _pauses(plan):
        busy &= ~((times >= T0 + at) & (times < T0 + at + length))
    return busy


def _gpu_columns(plan: Plan, rng: np.random.Generator, times: np.ndarray, rank: int):
    n = len(times)
    busy = _busy_mask(plan, times)
    straggler = rank == plan.straggler_rank
    util = np.where(busy, rng.uniform(93, 100, n), rng.uniform(0, 3, n))
    power = np.where(busy, rng.normal(640, 25, n), rng.normal(95, 5, n))
    reasons = np.where(busy, 0, 0x1).astype("u8")
    sm_clock = np.where(busy, 1980.0, 345.0)
    temp = np.where(busy, rng.normal(64, 2, n), 38.0)
    if straggler:  # a hot GPU: thermal slowdown a third of the time
        hot = busy & (rng.uniform(size=n) < 0.35)
        reasons = np.where(hot, 0x20, reasons).astype("u8")
        sm_clock = np.where(hot, 1600.0, sm_clock)
        temp = temp + 18
    energy = 3.6e6 + np.cumsum(power * plan.interval_s)
    cols = {
        "time": times,
        "utilization_gpu_pct": util,
        "utilization_memory_pct": util * 0.45,
        "memory_used_bytes": np.where(busy, 71 << 30, 70 << 30),
        "memory_total_bytes": np.full(n, 80 << 30),
        "power_w": power,
        "energy_j": energy,
        "temperature_gpu_c": temp,
        "temperature_memory_c": temp + 6,
        "clock_sm_mhz": sm_clock,
        "clock_mem_mhz": np.full(n, 2619.0),
        "clock_event_reasons": reasons,
        "pcie_tx_bytes_per_s": np.where(busy, rng.normal(2.0e9, 2e8, n), 1e6),
        "pcie_rx_bytes_per_s": np.where(busy, rng.normal(1.0e9, 1e8, n), 1e6),
        "nvlink_tx_bytes_per_s": np.where(busy, rng.normal(120e9, 5e9, n), 0.0),
        "nvlink_rx_bytes_per_s": np.where(busy, rng.normal(120e9, 5e9, n), 0.0),
        "ecc_corrected_volatile": np.zeros(n, dtype="i8"),
        "ecc_uncorrected_volatile": np.zeros(n, dtype="i8"),
        "retired_pages_sbe": np.zeros(n, dtype="i8"),
        "retired_pages_dbe": np.zeros(n, dtype="i8"),
        "remapped_rows_correctable": np.zeros(n, dtype="i8"),
        "remapped_rows_uncorrectable": np.zeros(n, dtype="i8"),
        "remapped_rows_pending": np.zeros(n, dtype="i8"),
        "gpm_sm_activity_pct": util * 0.8,
        "gpm_sm_occupancy_pct": util * 0.35,
        "gpm_tensor_activity_pct": util * 0.55,
        "gpm_dram_bw_util_pct": util * 0.4,
    }
    return cols


def _ib_columns(plan, rng, times):
    n = len(times)
    busy = _busy_mask(plan, times)
    rate = np.where(busy, rng.normal(22e9, 1e9, n), 1e5)
    wait = np.where(busy, rng.normal(2e6, 2e5, n), 0.0)
    xmit = np.cumsum(rate * plan.interval_s).astype("i8")
    rcv = np.cumsum(rate * plan.interval_s * 0.98).astype("i8")
    return {
        "time": times,
        "xmit_bytes": xmit,
        "xmit_bytes_per_s": rate,
        "rcv_bytes": rcv,
        "rcv_bytes_per_s": rate * 0.98,
        "xmit_packets": xmit // 4096,
        "rcv_packets": rcv // 4096,
        "xmit_wait": np.cumsum(wait).astype("i8"),
        "xmit_wait_per_s": wait,
        "xmit_discards": np.zeros(n, dtype="i8"),
        "rcv_errors": np.zeros(n, dtype="i8"),
        "symbol_error": np.zeros(n, dtype="i8"),
        "link_downed": np.zeros(n, dtype="i8"),
    }


def _host_columns(plan, rng, times):
    n = len(times)
    disk_r = np.cumsum(rng.uniform(1e6, 5e7, n)).astype("i8")
    disk_w = np.cumsum(rng.uniform(1e5, 1e6, n)).astype("i8")
    return {
        "time": times,
        "cpu_pct": rng.uniform(20, 40, n),
        "mem_used_bytes": np.full(n, 600 << 30),
        "mem_available_bytes": np.full(n, 1400 << 30),
        "mem_total_bytes": np.full(n, 2000 << 30),
        "swap_used_bytes": np.zeros(n, dtype="i8"),
        "load_1m": rng.uniform(20, 30, n),
        "load_5m": rng.uniform(20, 30, n),
        "load_15m": rng.uniform(20, 30, n),
        "disk_read_bytes": disk_r,
        "disk_write_bytes": disk_w,
        "disk_read_bytes_per_s": np.diff(disk_r, prepend=disk_r[0]) / plan.interval_s,
        "disk_write_bytes_per_s": np.diff(disk_w, prepend=disk_w[0]) / plan.interval_s,
    }


def _ib_spec(key: str) -> TableSpec:
    columns = [TIME]
    for column, _scale in COUNTERS.values():
        columns.append(Column(column, "i8", UNITS.get(column, "count")))
        if column in RATES:
            columns.append(Column(f"{column}_per_s", "f4", RATES[column]))
    attrs = {"link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)", "state": "4: ACTIVE"}
    return TableSpec(f"ib/{key}", columns, attrs)


def _events(plan: Plan, ranks: list[int], window: tuple[float, float]) -> list[dict]:
    """Checkpoint stall + background write in the window; preemption at the end of
    attempt 0 and restart at the start of attempt 1 when the plan has a restart."""
    lo, hi = window
    out = []
    for at, length, kind in _pauses(plan):
        if kind != CHECKPOINT or not lo <= at < hi:
            continue
        for r in ranks:
            out.append(_event(CHECKPOINT, at, at + length, r, {"phase": "stall"}))
            out.append(_event(CHECKPOINT, at + length, at + length + 25, r, {"phase": "write"}))
    if plan.restart_at_s is not None and hi == plan.restart_at_s:
        out += [_event(PREEMPTION, hi - 30, hi, r, {"signal": "SIGUSR1"}) for r in ranks]
    if lo > 0:
        out += [_event(RESTART, lo, lo, r, {"attempt": 1}) for r in ranks]
    return out


def _event(name: str, start: float, end: float, rank: int, attrs: dict) -> dict:
    return {
        "name": name,
        "start": T0 + start,
        "end": T0 + end,
        "step": -1,
        "rank": rank,
        "attrs": attrs,
    }


def generate(run_dir: Path, plan: Plan | None = None, jobs: int = 1) -> Plan:
    """Write plan.nodes node files (x2 attempts when plan.restart_at_s) under run_dir.

    One node at a time (memory holds one node's columns, not the job's), each table written
    in one call of whole arrays; `jobs` > 1 writes that many nodes at once in processes."""
    plan = plan or Plan()
    out_dir = telemetry_dir(Path(run_dir))
    windows = [(0.0, plan.duration_s)]
    if plan.restart_at_s is not None:
        windows = [
            (0.0, plan.restart_at_s),
            (plan.restart_at_s + plan.restart_downtime_s, plan.duration_s),
        ]
    tasks = [(a, w, i) for i in range(plan.nodes) for a, w in enumerate(windows)]
    if jobs <= 1:
        clock = _clock(plan)
        paths = [_write_node(plan, out_dir, a, w, i, clock) for a, w, i in tasks]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_write_node, plan, out_dir, a, w, i) for a, w, i in tasks]
            paths = [f.result() for f in futures]
    plan.files.extend(sorted(paths, key=lambda p: p.name))
    return plan


def _write_node(
    plan: Plan,
    out_dir: Path,
    attempt: int,
    window: tuple[float, float],
    node_index: int,
    clock: tuple[np.ndarray, np.ndarray] | None = None,
) -> Path:
    clock = clock if clock is not None else _clock(plan)
    times = T0 + np.arange(window[0], window[1], plan.interval_s)
    node = f"gpu-node{node_index:03d}"
    ranks = list(range(node_index * plan.gpus_per_node, (node_index + 1) * plan.gpus_per_node))
    rng = np.random.default_rng(plan.seed + 7919 * node_index + attempt)
    gpu_specs = [
        TableSpec(f"gpu/{g}", [TIME, *GPU_COLUMNS], {"name": "NVIDIA H100 80GB HBM3"})
        for g in range(plan.gpus_per_node)
    ]
    ib_keys = [f"mlx5_{p}_1" for p in range(plan.ib_ports)]
    specs = (
        gpu_specs
        + [TableSpec("host", HOST_COLUMNS)]
        + [TableSpec("host/net/eth0", NET_COLUMNS)]
        + [_ib_spec(k) for k in ib_keys]
        + [steps_spec(r) for r in ranks]
        + [events_spec()]
    )
    attrs = {
        "job_id": plan.job_id,
        "attempt": attempt,
        "slurm_restart_count": attempt,
        "node": node,
        "node_rank": node_index,
        "ranks": ranks,
        "world_size": plan.world_size,
        "num_nodes": plan.nodes,
        "interval_s": plan.interval_s,
        "gpu_models": ["NVIDIA H100 80GB HBM3"] * plan.gpus_per_node,
        "driver_version": "550.90.07",
        "torch_version": "2.13.0",
        "cuda_version": "12.8",
        "nccl_version": "2.27.3",
        "synthetic": True,
    }
    path = out_dir / node_file_name(node, attempt)
    writer = NodeFileWriter(path, specs, attrs, chunk_rows=4096)
    for g, rank in enumerate(ranks):
        writer.extend(f"gpu/{g}", _gpu_columns(plan, rng, times, rank))
        steps = _rank_steps(plan, rank, clock)
        sel = (steps["wall_time"] >= T0 + window[0]) & (steps["wall_time"] < T0 + window[1])
        writer.extend(f"steps/rank{rank}", {k: v[sel] for k, v in steps.items()})
        writer.flush()  # one GPU's and one rank's columns in memory at a time
    writer.extend("host", _host_columns(plan, rng, times))
    net = _host_columns(plan, rng, times)
    writer.extend(
        "host/net/eth0",
        {
            "time": times,
            "rx_bytes": net["disk_read_bytes"],
            "tx_bytes": net["disk_write_bytes"],
        },
    )
    for key in ib_keys:
        writer.extend(f"ib/{key}", _ib_columns(plan, rng, times))
    events = _events(plan, ranks, window)
    if events:
        writer.extend(
            "events",
            {
                "start": [e["start"] for e in events],
                "end": [e["end"] for e in events],
                "step": [e["step"] for e in events],
                "rank": [e["rank"] for e in events],
                "name": [e["name"].encode() for e in events],
                "attrs": [json.dumps(e["attrs"]).encode() for e in events],
            },
        )
    writer.close()
    return path
