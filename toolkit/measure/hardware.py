"""`python -m toolkit.measure.hardware [--dir DIR] [--world N] [--name NAME]`: measure this
machine and write a hardware profile, DIR/hardware/NAME.yaml, that any toolkit command loads
with `'hydra.searchpath=[file://DIR]' hardware=NAME` (or copy it into conf/hardware/).

Measured, per device (on CPU per core: one intra-op thread; `cores_per_node` records how many
cores the node's ranks share; the single kernels in toolkit.measure.kernel_rates): matmul FLOP/s over a grid of GEMM shapes (skinny to square)
per dtype, causal SDPA forward+backward, memory bandwidth (copy and triad), LayerNorm+GELU
throughput (as a fraction of the copy bandwidth), the cost of one eager op with autograd,
host<->device copies (GPU), a fixed one-thread speed probe (`probe_s`: later runs can say how
fast the machine is then), and for --world N > 1 all-gather latency and bandwidth between N
local processes (gloo on CPU, NCCL on GPU). The arithmetic that turns timings into the profile
is toolkit.perfmodel.profile.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import GPTConfig
from toolkit.config.optim import OptimConfig
from toolkit.config.parallel import MeshShape, ParallelConfig
from toolkit.config.precision import PrecisionConfig
from toolkit.distributed.fsdp import clip_grad_norm_, parallelize
from toolkit.distributed.host_memory import keep_freed_memory
from toolkit.distributed.mesh import build_mesh
from toolkit.measure.kernel_rates import (
    CPU_SIZES,
    DTYPES,
    GPU_SIZES,
    attention_rates,
    elementwise_rate,
    grid_shapes,
    host_device,
    matmul_rates,
    memory_bandwidth,
    model_gemm_shapes,
    seconds_per_call,
    speed_probe,
    sync,
)
from toolkit.perfmodel import comm, kernels, profile
from toolkit.perfmodel.model import Layout, fsdp_unit_collectives
from toolkit.train.flops import block_params, param_counts
from toolkit.train.models import build_model
from toolkit.train.models.blocks import Block
from toolkit.train.optim import build_optimizer

MESSAGE_BYTES = (4096, 65536, 1 << 20, 16 << 20)


def op_overhead(device: torch.device) -> float:
    """Seconds per op of the model's own block at a size where every kernel is trivial
    (dim 8, one token): forward + backward time / the ops the model counts per block."""
    block = Block(8, 1, 4.0, 1e-5).to(device)
    x = torch.randn(1, 1, 8, device=device, requires_grad=True)
    secs = seconds_per_call(lambda: block(x).sum().backward(), device)
    return secs / (kernels.BLOCK_FORWARD_OPS * (1 + kernels.BACKWARD_OPS_FACTOR))


def plain_and_sharded(
    cfg: GPTConfig, device: torch.device, timer: Callable[..., float]
) -> tuple[float, float, torch.nn.Module]:
    """Seconds of one forward+backward on 4 tokens without and with FSDP2 over all ranks of
    the process group, and the sharded model."""
    tokens = torch.zeros(1, 4, dtype=torch.long, device=device)
    plain = build_model(cfg).to(device)
    plain_s = timer(lambda: plain(tokens, tokens).backward(), device)
    model = build_model(cfg).to(device)
    par = ParallelConfig()
    mesh = build_mesh(MeshShape(dp_shard=dist.get_world_size()), device.type)["dp_shard"]
    parallelize(model, mesh, par, PrecisionConfig())
    return plain_s, timer(lambda: model(tokens, tokens).backward(), device), model


# The model FSDP2's data path is measured on: parameters dominate (2 x 12.6 M), compute does
# not (4 tokens).
FSDP_PATH_MODEL = GPTConfig(num_layers=2, dim=1024, num_heads=8, vocab_size=256, max_seq_len=8)


def copy_bytes(cfg: GPTConfig, world: int) -> float:
    """Bytes of FSDP2's copy-in/copy-out of one fp32 forward+backward of `cfg` over `world`
    ranks (toolkit.perfmodel.comm.fsdp_copy_bytes)."""
    return comm.fsdp_copy_bytes(
        total=param_counts(cfg)["total"],
        block=block_params(cfg.dim, cfg.mlp_ratio),
        blocks=cfg.num_layers,
        shard_size=world,
        grad_accum=1,
        param_dtype="float32",
        reduce_dtype="float32",
        reshard_after_forward=True,
    )


def fsdp_overheads(device: torch.device, tmp: Path) -> tuple[float, float, float]:
    """On a one-rank mesh: (seconds per FSDP2 unit collective beyond its data, seconds per
    foreach op of clipping + AdamW over sharded DTensor parameters, bytes/s of FSDP2's
    copy-in/copy-out).

    The per-collective cost is the forward+backward time of a trivial model (dim 8, 4
    tokens) with FSDP2 minus without, per unit all-gather/reduce-scatter; the copy rate is
    the same difference for FSDP_PATH_MODEL, less those per-collective costs, over the
    bytes its copies move (on one rank the collectives move nothing: what FSDP2 adds is its
    copies and bookkeeping)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{tmp / 'opt'}", rank=0, world_size=1)
    try:
        cfg = GPTConfig(num_layers=2, dim=8, num_heads=1, vocab_size=16, max_seq_len=4)
        plain_s, sharded_s, model = plain_and_sharded(cfg, device, seconds_per_call)
        optimizer = build_optimizer(model, OptimConfig())

        def step() -> None:
            clip_grad_norm_(model, 1.0)
            optimizer.step()

        step_s = seconds_per_call(step, device)
        big_plain_s, big_sharded_s, _ = plain_and_sharded(FSDP_PATH_MODEL, device, seconds_per_call)
    finally:
        dist.destroy_process_group()
    layout = Layout(world_size=1, ranks_per_node=1, micro_batch_size=1, grad_accum=1, seq_len=4)
    per_collective = max(0.0, sharded_s - plain_s) / fsdp_unit_collectives(cfg, layout)
    bookkeeping = per_collective * fsdp_unit_collectives(FSDP_PATH_MODEL, layout)
    copy_s = big_sharded_s - big_plain_s - bookkeeping
    copy_rate = copy_bytes(FSDP_PATH_MODEL, 1) / copy_s if copy_s > 0 else float("inf")
    return per_collective, step_s / kernels.optimizer_ops(cfg), copy_rate


def thread_efficiency(device: torch.device, cores: int) -> float:
    """CPU: the rate with `cores` intra-op threads in one process over `cores` x the
    one-thread rate, for a 1024^3 GEMM and LayerNorm+GELU (the mean of the two); 1 on GPU."""
    if device.type == "cuda" or cores < 2:
        return 1.0

    def rates() -> tuple[float, float]:
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        return 1.0 / seconds_per_call(lambda: a @ b, device), elementwise_rate(device, 2048, 1024)

    one = rates()
    torch.set_num_threads(cores)
    try:
        many = rates()
    finally:
        torch.set_num_threads(1)
    return round(min(1.0, sum(m / (cores * o) for m, o in zip(many, one, strict=True)) / 2), 4)


def _allgather_worker(rank: int, world: int, init: str, backend: str, out: str) -> None:
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    else:
        keep_freed_memory()
    torch.set_num_threads(1)
    points = []
    for size in MESSAGE_BYTES:
        shard = torch.ones(size // 4 // world, device=device)
        full = torch.empty(shard.numel() * world, device=device)
        iters = 50 if size <= 65536 else 10  # the same count on every rank
        for _ in range(3):
            dist.all_gather_into_tensor(full, shard)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_gather_into_tensor(full, shard)
        sync(device)
        secs = (time.perf_counter() - t0) / iters
        points.append((shard.numel() * 4 * (world - 1), secs))
    fsdp = fsdp_path(device)
    if rank == 0:
        Path(out).write_text(repr({"allgather": points, "fsdp": fsdp}))
    dist.destroy_process_group()


def timed_fixed(
    fn: Callable[[], object], device: torch.device, iters: int = 3, batches: int = 5
) -> float:
    """Seconds per call, the median of `batches` batches of a fixed count (collectives: every
    rank must call as often). One batch alone varied 2x between profiles on the 2-core VM."""
    fn()
    times = []
    for _ in range(batches):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / iters)
    return sorted(times)[len(times) // 2]


def fsdp_path(device: torch.device) -> tuple[float, float, float, float]:
    """(bytes each rank receives, collective calls, extra seconds, bytes FSDP2's copies
    move) of one forward+backward of FSDP_PATH_MODEL on 4 tokens with FSDP2 over all ranks,
    against the same model unsharded: the collectives as FSDP2 runs them (copy-in/out, gloo
    or NCCL, the reduce-scatter's reduction), with the compute negligible and subtracted."""
    cfg = FSDP_PATH_MODEL
    plain_s, sharded_s, _ = plain_and_sharded(cfg, device, timed_fixed)
    c = comm.communication(
        cfg,
        shard_size=dist.get_world_size(),
        replicate=1,
        grad_accum=1,
        param_dtype="float32",
        reduce_dtype="float32",
        reshard_after_forward=True,
    )
    return (
        c["allgather_bytes"] + c["reduce_scatter_bytes"],
        c["allgather_calls"] + c["reduce_scatter_calls"],
        max(0.0, sharded_s - plain_s),
        copy_bytes(cfg, dist.get_world_size()),
    )


def collective_points(world: int, cuda: bool, tmp: Path) -> dict[str, object]:
    import torch.multiprocessing as mp

    init = f"file://{tmp / 'store'}"
    out = tmp / "points.txt"
    mp.spawn(
        _allgather_worker, args=(world, init, "nccl" if cuda else "gloo", str(out)), nprocs=world
    )
    import ast

    return ast.literal_eval(out.read_text())


def measure(
    world: int, name: str, dtypes: list[str], extra_gemms: list[tuple[int, int, int]] = ()
) -> tuple[HardwareConfig, list[str]]:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(1)  # per-core rates; the model scales by threads per rank
        keep_freed_memory()  # as the CPU ranks run (toolkit.distributed.host_memory)
    sizes = GPU_SIZES if cuda else CPU_SIZES
    extra = list(extra_gemms)
    mm = matmul_rates(
        device, dtypes, grid_shapes(sizes) + [x for x in extra if x not in grid_shapes(sizes)]
    )
    peaks = {d: max(r for *_, dt, r in mm if dt == d) for d in dtypes}
    attn = attention_rates(
        device,
        dtypes,
        (512, 2048, 8192) if cuda else (128, 512),
        (64, 128) if cuda else (16, 32, 64),  # the presets' head dims: 16 (gpt_tiny), 32, 64
    )
    mem = memory_bandwidth(device, (256 << 20) if cuda else (16 << 20))
    bandwidth = max(mem.values())
    elementwise = elementwise_rate(device, 8192 if cuda else 2048, 1024)
    probe = speed_probe(device)
    overhead = op_overhead(device)
    cores = len(os.sched_getaffinity(0))
    efficiency = thread_efficiency(device, cores)
    threaded_overhead = overhead
    if not cuda and cores > 1:
        torch.set_num_threads(cores)  # one rank alone on the node: every op forks threads
        threaded_overhead = op_overhead(device)
        torch.set_num_threads(1)
    h2d = host_device(device, 64 << 20)
    latency, link = 2.0e-5, bandwidth
    raw_link = link
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        fsdp_overhead, optimizer_overhead, copy_rate = fsdp_overheads(device, Path(tmp))
        copy_fraction = round(min(1.0, copy_rate / bandwidth), 4)
        if world > 1:
            points = collective_points(world, cuda, Path(tmp))
            latency, raw_link = profile.latency_bandwidth(points["allgather"])  # type: ignore[arg-type]
            fsdp_bytes, calls, extra_s, moved = points["fsdp"]  # type: ignore[misc]
            copies_s = moved / (bandwidth * copy_fraction)
            link = profile.fsdp_bandwidth(
                fsdp_bytes, extra_s, calls * (latency + fsdp_overhead) + copies_s, raw_link
            )
    if cuda:
        memory_bytes = float(torch.cuda.get_device_properties(device).total_memory)
    else:
        memory_bytes = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    host = socket.gethostname()
    hw = HardwareConfig(
        name=name,
        source=f"measured by python -m toolkit.measure.hardware on {host}, {when}",
        peak_flops_fp32=peaks.get("float32", peaks[dtypes[0]]),
        peak_flops_bf16=peaks.get("bfloat16", peaks[dtypes[0]]),
        memory_bandwidth=bandwidth,
        memory_bytes=memory_bytes,
        intra_node_bandwidth=link,
        inter_node_bandwidth=link,
        nics_per_node=1,
        intra_node_latency_s=latency,
        inter_node_latency_s=latency,
        intra_node_step_latency_s=0.0,  # the measured call's time is its whole latency
        inter_node_step_latency_s=0.0,
        host_device_bandwidth=h2d or bandwidth,
        elementwise_fraction=round(min(1.0, elementwise / bandwidth), 4),
        op_overhead_s=overhead,
        optimizer_op_overhead_s=optimizer_overhead,
        fsdp_collective_overhead_s=fsdp_overhead,
        fsdp_copy_fraction=copy_fraction,
        comm_overlap=1.0 if cuda else 0.0,
        cores_per_node=0 if cuda else cores,
        thread_efficiency=efficiency,
        uncertainty=0.25,
        probe_s=probe,
        threaded_op_overhead_s=threaded_overhead,
        matmul=profile.gemm_table(mm, peaks),
        attention=profile.attention_table(attn, peaks),
    )
    device_name = torch.cuda.get_device_name(device) if cuda else "CPU, 1 thread per core"
    comments = [
        f"Hardware profile of {host} ({device_name}), measured {when}.",
        f"Peaks = best GEMM of the grid; memory copy {mem['copy']:.3e} B/s, triad {mem['triad']:.3e} B/s;",
        f"FSDP2's copy-in/copy-out measured at {copy_rate:.3e} B/s on one rank;",
        f"all-gather over {world} local ranks: latency {latency:.2e} s, raw bandwidth "
        f"{raw_link:.3e} B/s; bandwidth through FSDP2 (used) {link:.3e} B/s;"
        if world > 1
        else "no collective measured (--world 1): links set to the memory bandwidth.",
        "inter_node_* are NOT measured here (one node): edit them for multi-node predictions.",
        f"load average while measuring: {os.getloadavg()}",
    ]
    return hw, comments


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m toolkit.measure.hardware")
    p.add_argument("--name", default=f"measured_{socket.gethostname().split('.')[0]}")
    p.add_argument(
        "--dir", type=Path, default=Path("outputs/hardware"), help="writes DIR/hardware/NAME.yaml"
    )
    p.add_argument("--world", type=int, default=2, help="local ranks for the all-gather")
    p.add_argument("--dtypes", default="float32", help="comma-separated: float32,bfloat16")
    p.add_argument(
        "--gemms-of",
        default="",
        metavar="MODEL:TOKENS,...",
        help="also measure the GEMMs of these presets' layers at TOKENS per micro-step "
        "(micro-batch x sequence), e.g. gpt_125m:128,gpt_small:1024",
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    dtypes = args.dtypes.split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or args.world < 1:
        print(
            f"error: --dtypes {bad} / --world {args.world}: allowed dtypes {list(DTYPES)}, world >= 1",
            file=sys.stderr,
        )
        return 2
    out = args.dir.resolve() / "hardware" / f"{args.name}.yaml"
    try:
        gemm_shapes = model_gemm_shapes(args.gemms_of)
    except Exception as exc:  # noqa: BLE001 - a bad preset name or token count: one line
        print(f"error: --gemms-of {args.gemms_of}: {exc}", file=sys.stderr)
        return 2
    hw, comments = measure(args.world, args.name, dtypes, gemm_shapes)
    if gemm_shapes:
        comments.append(f"GEMMs of {args.gemms_of} measured too: {len(gemm_shapes)} shapes")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile.profile_yaml(hw, comments))
    print(
        f"wrote {out}; use it with: 'hydra.searchpath=[file://{out.parent.parent}]' hardware={args.name}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
