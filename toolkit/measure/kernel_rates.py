"""What single kernels achieve on one device, for the hardware profile (toolkit.measure.hardware):
GEMM FLOP/s over a grid of shapes and, on request, over a preset's own layer shapes; causal
SDPA per sequence and head dim; memory copy/triad bandwidth; LayerNorm+GELU throughput; the
host-to-device copy (GPU); a fixed one-thread speed probe. Each is the median of timed
batches (`seconds_per_call`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from toolkit.perfmodel import kernels, profile

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CPU_SIZES = (64, 256, 1024)
GPU_SIZES = (256, 1024, 4096, 16384)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], object], device: torch.device, min_s: float = 0.05) -> float:
    """Median of 3 timed batches, each repeating fn for about min_s after one warm-up call."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(min_s / once))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / reps)
    return sorted(times)[1]


def grid_shapes(sizes: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Every (m, n, k) of the cube of `sizes`: skinny to square."""
    return [(m, n, k) for m in sizes for n in sizes for k in sizes]


def model_gemm_shapes(spec: str) -> list[tuple[int, int, int]]:
    """The GEMMs a training step of each preset runs, forward and both backward GEMMs of every
    linear, for `spec` = "MODEL:TOKENS[,MODEL:TOKENS...]" (TOKENS = micro-batch x sequence):
    the model then reads its own shapes' rates instead of the nearest grid point's (a 50k
    vocabulary head is far outside a CPU grid of 64-1024)."""
    from toolkit.config.compose import compose_raw, to_job

    shapes: list[tuple[int, int, int]] = []
    for item in filter(None, spec.split(",")):
        name, _, tokens = item.partition(":")
        model = to_job(compose_raw([f"model={name}"])).model
        width = kernels.output_width(model)
        for _, m, n, k in kernels.gemm_shapes(model, int(tokens), width):
            for shape in ((m, n, k), *kernels.backward_shapes(m, n, k)):
                if shape not in shapes:
                    shapes.append(shape)
    return shapes


def matmul_rates(device: torch.device, dtypes: list[str], shapes: list[tuple[int, int, int]]):
    rates = []
    for dtype in dtypes:
        for m, n, k in shapes:
            a = torch.randn(m, k, device=device, dtype=DTYPES[dtype])
            b = torch.randn(k, n, device=device, dtype=DTYPES[dtype])
            s = seconds_per_call(lambda a=a, b=b: a @ b, device)
            rates.append((m, n, k, dtype, profile.gemm_flops(m, n, k) / s))
    return rates


def attention_rates(
    device: torch.device, dtypes: list[str], seq_lens: tuple[int, ...], head_dims: tuple[int, ...]
):
    """Causal SDPA forward+backward FLOP/s per (sequence, head dim, dtype): small heads run
    far below large ones on CPU (gpt_tiny's 16 against 64), so the table holds the head
    dims the presets use and the model reads the nearest one."""
    rates = []
    batch_heads = 8
    for dtype in dtypes:
        for head_dim in head_dims:
            for s in seq_lens:
                shape = (1, batch_heads, s, head_dim)
                q, k, v = (
                    torch.randn(shape, device=device, dtype=DTYPES[dtype], requires_grad=True)
                    for _ in range(3)
                )

                def step(q=q, k=k, v=v) -> None:
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

                secs = seconds_per_call(step, device)
                flops = profile.causal_sdpa_flops(batch_heads, s, head_dim)
                rates.append((s, head_dim, dtype, flops / secs))
    return rates


def memory_bandwidth(device: torch.device, numel: int) -> dict[str, float]:
    a, b, c = (torch.rand(numel, device=device) for _ in range(3))
    copy = 2 * 4 * numel / seconds_per_call(lambda: a.copy_(b), device)
    triad = 3 * 4 * numel / seconds_per_call(lambda: torch.add(b, c, alpha=2.0, out=a), device)
    return {"copy": copy, "triad": triad}


def elementwise_rate(device: torch.device, tokens: int, dim: int) -> float:
    """Bytes/s of LayerNorm + tanh-GELU forward (each reads and writes tokens x dim fp32)."""
    x = torch.randn(tokens, dim, device=device)
    w, bias = torch.ones(dim, device=device), torch.zeros(dim, device=device)
    secs = seconds_per_call(
        lambda: F.gelu(F.layer_norm(x, (dim,), w, bias), approximate="tanh"), device
    )
    return 2 * 2 * 4 * tokens * dim / secs


def speed_probe(device: torch.device) -> float:
    """Seconds of a fixed piece of work on one thread: a 512^3 GEMM and a tanh GELU forward
    + backward on 1024 x 1024 values, the median of 5 `seconds_per_call` (each itself the
    median of 3 timed batches of about 20 ms). The profile records it
    (`probe_s`) and toolkit.measure.model_check runs it again before every configuration: on
    a shared VM the same work takes 1.5x longer some minutes than others, which no
    prediction from an earlier profile can know."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(512, 512, device=device), torch.randn(512, 512, device=device)
        x = torch.randn(1024, 1024, device=device, requires_grad=True)
        grad = torch.randn(1024, 1024, device=device)

        def work() -> None:
            a @ b
            torch.autograd.grad(F.gelu(x, approximate="tanh"), x, grad)

        work()
        times = sorted(seconds_per_call(work, device, min_s=0.02) for _ in range(5))
        return times[2]
    finally:
        torch.set_num_threads(threads)


def host_device(device: torch.device, numel: int) -> float:
    if device.type != "cuda":
        return 0.0
    host = torch.empty(numel, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(numel, dtype=torch.float32, device=device)
    return 4 * numel / seconds_per_call(lambda: dev.copy_(host, non_blocking=True), device)
