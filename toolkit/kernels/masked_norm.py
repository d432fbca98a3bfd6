"""Masked cross-sectional normalisation: for every (row, feature) of x [..., instruments,
features], standardise across instruments using only the observed values.

    c      = number of observed instruments (mask true)
    mean   = sum_observed(x) / max(c, 1)
    var    = sum_observed((x - mean)^2) / max(c, 1)        (population variance)
    y      = (x - mean) / sqrt(var + eps)   where observed,  0 where missing

A row with no observed value gives 0 everywhere; a row with one observed value gives 0
there too (x - mean = 0), never NaN or inf. Missing positions may hold anything (NaN
included): they are never read into a sum. The gradient wrt x is the LayerNorm gradient
restricted to the observed set (0 at missing positions); the mask has no gradient.

Why fused: the reference materialises the masked copy, the deviations and their squares
(several tensors the size of x, each a pass over memory); the Triton kernel reads x and the
mask once per pass over a row that stays in cache, and saves only mean and rstd (one value per
row and feature) for the backward.

Layout: [..., instruments, features], features fastest (the order toolkit.data.loader flattens
a cross-section into the model's [batch, time, instruments * features]); any leading dims."""

from __future__ import annotations

import math

import torch

from toolkit.kernels.backend import triton_runs_on
from toolkit.kernels.cases import KernelCase

REFERENCE_CHUNK_ROWS = 4096  # rows (leading positions) per step of the reference


def _check(x: torch.Tensor, mask: torch.Tensor) -> None:
    if x.dim() < 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected [..., instruments, features]")
    if mask.shape != x.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected x's {tuple(x.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask has dtype {mask.dtype}; expected torch.bool")


def masked_cross_section_norm_reference(
    x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    """Plain PyTorch (autograd does the backward), fp32 arithmetic, REFERENCE_CHUNK_ROWS
    leading positions at a time so its temporaries stay bounded; output in x's dtype."""
    _check(x, mask)
    n, f = x.shape[-2:]
    xs, ms = x.reshape(-1, n, f), mask.reshape(-1, n, f)
    out = []
    for lo in range(0, xs.shape[0], REFERENCE_CHUNK_ROWS):
        xc, mc = xs[lo : lo + REFERENCE_CHUNK_ROWS].float(), ms[lo : lo + REFERENCE_CHUNK_ROWS]
        xc = torch.where(mc, xc, 0.0)
        count = mc.sum(dim=1, keepdim=True).clamp(min=1)
        mean = xc.sum(dim=1, keepdim=True) / count
        dev = torch.where(mc, xc - mean, 0.0)
        var = (dev * dev).sum(dim=1, keepdim=True) / count
        out.append((dev * torch.rsqrt(var + eps)).to(x.dtype))
    return torch.cat(out).reshape(x.shape)


# --- Triton -------------------------------------------------------------------------------
# One program per (row, block of features); it walks the instruments in blocks of BLOCK_N:
# pass 1 sums and counts, pass 2 sums squared deviations, pass 3 writes. With the whole
# cross-section in one block (the usual case) the loads after the first hit cache.

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference still works; triton_runs_on() says False
    triton = None

if triton is not None:

    @triton.jit
    def _tile(X, M, base, n0, N, F, cols, col_ok, BLOCK_N: tl.constexpr):
        """Rows [n0, n0 + BLOCK_N) of one (batch, time) row's [N, F] block: offsets, the
        in-bounds mask, the observed mask and x in fp32 (0 where not observed; a missing
        value, NaN included, is never read)."""
        ns = n0 + tl.arange(0, BLOCK_N)
        idx = base + ns[:, None] * F + cols[None, :]
        ok = (ns[:, None] < N) & col_ok[None, :]
        m = tl.load(M + idx, mask=ok, other=0) != 0
        x = tl.load(X + idx, mask=ok & m, other=0.0).to(tl.float32)
        return idx, ok, m, x

    @triton.jit
    def _norm_fwd(X, M, Y, MEAN, RSTD, N, F, eps, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        col_ok = cols < F
        base = row.to(tl.int64) * N * F
        total = tl.zeros([BLOCK_F], dtype=tl.float32)
        count = tl.zeros([BLOCK_F], dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            idx, ok, m, x = _tile(X, M, base, n0, N, F, cols, col_ok, BLOCK_N)
            total += tl.sum(tl.where(m, x, 0.0), axis=0)
            count += tl.sum(m.to(tl.float32), axis=0)
        count = tl.maximum(count, 1.0)
        mean = total / count
        sq = tl.zeros([BLOCK_F], dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            idx, ok, m, x = _tile(X, M, base, n0, N, F, cols, col_ok, BLOCK_N)
            d = tl.where(m, x - mean[None, :], 0.0)
            sq += tl.sum(d * d, axis=0)
        rstd = 1.0 / tl.sqrt(sq / count + eps)
        for n0 in range(0, N, BLOCK_N):
            idx, ok, m, x = _tile(X, M, base, n0, N, F, cols, col_ok, BLOCK_N)
            y = tl.where(m, (x - mean[None, :]) * rstd[None, :], 0.0)
            tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=ok)
        stat = row.to(tl.int64) * F + cols
        tl.store(MEAN + stat, mean, mask=col_ok)
        tl.store(RSTD + stat, rstd, mask=col_ok)

    @triton.jit
    def _norm_bwd(DY, X, M, MEAN, RSTD, DX, N, F, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
        # dx = rstd * (dy - mean_obs(dy) - y * mean_obs(dy * y)) on observed, 0 elsewhere.
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        col_ok = cols < F
        base = row.to(tl.int64) * N * F
        stat = row.to(tl.int64) * F + cols
        mean = tl.load(MEAN + stat, mask=col_ok, other=0.0)
        rstd = tl.load(RSTD + stat, mask=col_ok, other=0.0)
        sum_g = tl.zeros([BLOCK_F], dtype=tl.float32)
        sum_gy = tl.zeros([BLOCK_F], dtype=tl.float32)
        count = tl.zeros([BLOCK_F], dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            idx, ok, m, x = _tile(X, M, base, n0, N, F, cols, col_ok, BLOCK_N)
            g = tl.load(DY + idx, mask=ok & m, other=0.0).to(tl.float32)
            y = tl.where(m, (x - mean[None, :]) * rstd[None, :], 0.0)
            g = tl.where(m, g, 0.0)
            sum_g += tl.sum(g, axis=0)
            sum_gy += tl.sum(g * y, axis=0)
            count += tl.sum(m.to(tl.float32), axis=0)
        count = tl.maximum(count, 1.0)
        mean_g = sum_g / count
        mean_gy = sum_gy / count
        for n0 in range(0, N, BLOCK_N):
            idx, ok, m, x = _tile(X, M, base, n0, N, F, cols, col_ok, BLOCK_N)
            g = tl.load(DY + idx, mask=ok & m, other=0.0).to(tl.float32)
            y = (x - mean[None, :]) * rstd[None, :]
            dx = tl.where(m, rstd[None, :] * (g - mean_g[None, :] - y * mean_gy[None, :]), 0.0)
            tl.store(DX + idx, dx.to(DX.dtype.element_ty), mask=ok)


def _blocks(n: int, f: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_F, feature blocks): a tile of at most 4096 elements, all features of
    a row in one program when they fit."""
    block_f = min(triton.next_power_of_2(f), 64)
    block_n = max(1, min(triton.next_power_of_2(n), 4096 // block_f))
    return block_n, block_f, triton.cdiv(f, block_f)


def _as_rows(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, f = x.shape[-2:]
    return x.reshape(-1, n, f).contiguous(), mask.reshape(-1, n, f).contiguous().view(torch.uint8)


@torch.library.custom_op("toolkit::masked_cs_norm_fwd", mutates_args=())
def _fwd_op(
    x: torch.Tensor, mask: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, f = x.shape[-2:]
    xs, ms = _as_rows(x, mask)
    rows = xs.shape[0]
    y = torch.empty_like(xs)
    mean = torch.empty(rows, f, device=x.device, dtype=torch.float32)
    rstd = torch.empty(rows, f, device=x.device, dtype=torch.float32)
    if rows:
        block_n, block_f, f_blocks = _blocks(n, f)
        _norm_fwd[(rows, f_blocks)](xs, ms, y, mean, rstd, n, f, eps, block_n, block_f)
    return y.reshape(x.shape), mean, rstd


@_fwd_op.register_fake
def _(x, mask, eps):
    stat = x.new_empty((math.prod(x.shape[:-2]), x.shape[-1]), dtype=torch.float32)
    return x.new_empty(x.shape), stat, torch.empty_like(stat)  # contiguous, as the kernel's


@torch.library.custom_op("toolkit::masked_cs_norm_bwd", mutates_args=())
def _bwd_op(
    grad: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> torch.Tensor:
    n, f = x.shape[-2:]
    xs, ms = _as_rows(x, mask)
    gs = grad.reshape(xs.shape).contiguous()
    dx = torch.empty_like(xs)
    if xs.shape[0]:
        block_n, block_f, f_blocks = _blocks(n, f)
        _norm_bwd[(xs.shape[0], f_blocks)](gs, xs, ms, mean, rstd, dx, n, f, block_n, block_f)
    return dx.reshape(x.shape)


@_bwd_op.register_fake
def _(grad, x, mask, mean, rstd):
    return x.new_empty(x.shape)


def _setup(ctx, inputs, output) -> None:
    x, mask, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, mask, mean, rstd)


def _backward(ctx, grad_y, grad_mean, grad_rstd):
    # mean and rstd are saved statistics, not part of the public output: their grads are
    # ignored (the public function never returns them).
    x, mask, mean, rstd = ctx.saved_tensors
    return _bwd_op(grad_y, x, mask, mean, rstd), None, None


_fwd_op.register_autograd(_backward, setup_context=_setup)


def masked_cross_section_norm(
    x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    """The fused op (toolkit::masked_cs_norm_fwd/bwd) where Triton runs on x's device, the
    reference elsewhere; same formula (module docstring), fp32 accumulation either way."""
    _check(x, mask)
    if not triton_runs_on(x.device):
        return masked_cross_section_norm_reference(x, mask, eps)
    return _fwd_op(x, mask, float(eps))[0]


# --- benchmark cases (toolkit.kernels.cases) ------------------------------------------------

SIZES = {"test": (2, 3, 7, 3), "bench": (32, 256, 512, 8)}  # batch, time, instruments, features
MISSING_FRACTION = 0.1


def make_inputs(size: str, dtype: torch.dtype, device: torch.device) -> tuple:
    b, t, n, f = SIZES[size]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, t, n, f, generator=gen).to(device=device, dtype=dtype)
    mask = (torch.rand(b, t, n, f, generator=gen) >= MISSING_FRACTION).to(device)
    return x.requires_grad_(True), mask


BENCH_CASES = (
    KernelCase(
        name="masked_cross_section_norm",
        make_inputs=make_inputs,
        reference=masked_cross_section_norm_reference,
        kernel=masked_cross_section_norm,
        shape="batch 32 x time 256 x 512 instruments x 8 features, 10 % missing",
        meta_kernel=lambda x, mask: _fwd_op(x, mask, 1e-5)[0],
    ),
)
