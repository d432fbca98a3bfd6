"""Masked regression loss: MSE or Huber over predictions and targets [..., instruments], with
missing targets (NaN, or false in an optional mask) excluded from the error but counted in
the mean, and an optional per-instrument weight [instruments]:

    e_i    = pred_i - target_i
    l(e)   = e^2                                    kind="mse"
           = 0.5 e^2            if |e| <= delta     kind="huber" (torch.nn.HuberLoss's form)
             delta (|e| - 0.5 delta) otherwise
    loss   = sum_{i observed} w_{instrument(i)} l(e_i) / numel(target)

Missing targets count in the denominator (numel, not the number observed), as the
time-series model's masked_mse always did: a batch's loss is then the plain sum of its
micro-batches' and ranks' shares, however it is split. With weight None (all ones) and
kind="mse" this is masked_mse exactly. Weights scale each instrument's share; weights that
average 1 keep the loss's scale. The loss is fp32 whatever pred's dtype; targets get no
gradient.

Why fused: the reference materialises the error, the observed mask and the squared error
(each the size of pred) and autograd keeps some of them for the backward; the kernel reads
pred and target once into per-block partial sums, and its backward recomputes the error."""

from __future__ import annotations

import torch

from toolkit.kernels.backend import triton_runs_on
from toolkit.kernels.cases import KernelCase

KINDS = ("mse", "huber")
REFERENCE_CHUNK = 1 << 22  # elements per step of the reference (one step below this)
BLOCK = 1024  # elements per Triton program


def _check(pred, target, weight, kind, delta, mask) -> None:
    if pred.shape != target.shape:
        raise ValueError(
            f"pred has shape {tuple(pred.shape)}; expected target's {tuple(target.shape)}"
        )
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: unknown loss; allowed: {', '.join(KINDS)}")
    if kind == "huber" and not delta > 0:
        raise ValueError(f"delta={delta}: the Huber threshold must be > 0")
    if weight is not None and (weight.dim() != 1 or weight.shape[0] != pred.shape[-1]):
        raise ValueError(
            f"weight has shape {tuple(weight.shape)}; expected [instruments] = [{pred.shape[-1]}]"
        )
    if mask is not None and (mask.shape != target.shape or mask.dtype != torch.bool):
        raise ValueError(f"mask must be a bool tensor of target's shape {tuple(target.shape)}")


def _elementwise(err: torch.Tensor, kind: str, delta: float) -> torch.Tensor:
    if kind == "mse":
        return err * err
    return torch.nn.functional.huber_loss(err, torch.zeros_like(err), reduction="none", delta=delta)


def masked_regression_loss_reference(
    pred: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    kind: str = "mse",
    delta: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain PyTorch in fp32 (autograd does the backward). Up to REFERENCE_CHUNK elements it
    is masked_mse's own expression, (w * l).mean(); above, sums of chunks over numel."""
    _check(pred, target, weight, kind, delta, mask)
    p, t = pred.reshape(-1, pred.shape[-1]), target.reshape(-1, target.shape[-1])
    m = None if mask is None else mask.reshape(t.shape)
    rows = max(1, REFERENCE_CHUNK // max(1, p.shape[-1]))
    parts = []
    for lo in range(0, max(p.shape[0], 1), rows):
        tc = t[lo : lo + rows]
        observed = torch.isfinite(tc) if m is None else torch.isfinite(tc) & m[lo : lo + rows]
        err = torch.where(observed, p[lo : lo + rows].float() - tc.float().nan_to_num(), 0.0)
        loss = _elementwise(err, kind, delta)
        if weight is not None:
            loss = loss * weight.float()
        parts.append(loss)
    if len(parts) == 1:
        return parts[0].mean()
    return sum(part.sum() for part in parts) / target.numel()


# --- Triton ---------------------------------------------------------------------------------

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference still works; triton_runs_on() says False
    triton = None

if triton is not None:

    @triton.jit
    def _errors(P, T, numel, BLOCK: tl.constexpr):
        """This program's offsets, the in-bounds mask, the observed mask (a finite target) and
        the error pred - target in fp32 (0 where not observed; pred is not read there)."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < numel
        t = tl.load(T + offs, mask=ok, other=float("nan")).to(tl.float32)
        observed = ok & (t == t) & (tl.abs(t) < float("inf"))
        p = tl.load(P + offs, mask=observed, other=0.0).to(tl.float32)
        return offs, ok, observed, tl.where(observed, p - t, 0.0)

    @triton.jit
    def _loss_fwd(
        P, T, W, PARTIAL, numel, N, delta,
        HUBER: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # One partial sum per program, summed in a fixed order afterwards: deterministic.
        offs, ok, observed, e = _errors(P, T, numel, BLOCK)
        if HUBER:
            a = tl.abs(e)
            loss = tl.where(a <= delta, 0.5 * e * e, delta * (a - 0.5 * delta))
        else:
            loss = e * e
        if HAS_WEIGHT:
            loss = loss * tl.load(W + offs % N, mask=observed, other=0.0).to(tl.float32)
        tl.store(PARTIAL + tl.program_id(0), tl.sum(tl.where(observed, loss, 0.0), axis=0))

    @triton.jit
    def _loss_bwd(
        GO, P, T, W, DP, numel, N, delta, inv_numel,
        HUBER: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        offs, ok, observed, e = _errors(P, T, numel, BLOCK)
        if HUBER:
            d = tl.minimum(tl.maximum(e, -delta), delta)  # e inside [-delta, delta], else +-delta
        else:
            d = 2.0 * e
        scale = tl.load(GO).to(tl.float32) * inv_numel
        if HAS_WEIGHT:
            scale = scale * tl.load(W + offs % N, mask=observed, other=0.0).to(tl.float32)
        tl.store(DP + offs, tl.where(observed, d * scale, 0.0).to(DP.dtype.element_ty), mask=ok)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).contiguous()


@torch.library.custom_op("toolkit::masked_regression_loss", mutates_args=())
def _fwd_op(
    pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, kind: str, delta: float
) -> torch.Tensor:
    numel = target.numel()
    if numel == 0:
        return torch.full((), float("nan"), device=pred.device)  # as torch's mean of nothing
    programs = triton.cdiv(numel, BLOCK)
    partial = torch.empty(programs, device=pred.device, dtype=torch.float32)
    w = weight if weight is not None else partial  # a placeholder pointer, never read
    _loss_fwd[(programs,)](
        _flat(pred), _flat(target), w.contiguous(), partial, numel, pred.shape[-1], delta,
        kind == "huber", weight is not None, BLOCK,
    )  # fmt: skip
    return partial.sum() / numel


@_fwd_op.register_fake
def _(pred, target, weight, kind, delta):
    return pred.new_empty((), dtype=torch.float32)


@torch.library.custom_op("toolkit::masked_regression_loss_bwd", mutates_args=())
def _bwd_op(
    grad: torch.Tensor,
    pred: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    kind: str,
    delta: float,
) -> torch.Tensor:
    numel = target.numel()
    dp = torch.empty(pred.shape, device=pred.device, dtype=pred.dtype)
    if numel == 0:
        return dp
    programs = triton.cdiv(numel, BLOCK)
    w = weight if weight is not None else dp
    _loss_bwd[(programs,)](
        grad.float().contiguous(), _flat(pred), _flat(target), w.contiguous(), dp,
        numel, pred.shape[-1], delta, 1.0 / numel, kind == "huber", weight is not None, BLOCK,
    )  # fmt: skip
    return dp


@_bwd_op.register_fake
def _(grad, pred, target, weight, kind, delta):
    return pred.new_empty(pred.shape)  # contiguous, as the kernel's


def _setup(ctx, inputs, output) -> None:
    pred, target, weight, kind, delta = inputs
    ctx.save_for_backward(pred, target, weight)
    ctx.kind, ctx.delta = kind, delta


def _backward(ctx, grad):
    pred, target, weight = ctx.saved_tensors
    return _bwd_op(grad, pred, target, weight, ctx.kind, ctx.delta), None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup)


def masked_regression_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    kind: str = "mse",
    delta: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused op (toolkit::masked_regression_loss) where Triton runs on pred's device, the
    reference elsewhere; same formula (module docstring). A mask, when given, is folded into
    the target as NaN before the kernel (one elementwise pass)."""
    _check(pred, target, weight, kind, delta, mask)
    if not triton_runs_on(pred.device):
        return masked_regression_loss_reference(pred, target, weight, kind, delta, mask)
    if mask is not None:
        target = torch.where(mask, target, float("nan"))
    return _fwd_op(pred, target.detach(), weight, kind, float(delta))


# --- benchmark cases (toolkit.kernels.cases) ------------------------------------------------

SIZES = {"test": (2, 5, 7), "bench": (32, 256, 512)}  # batch, time, instruments
MISSING_FRACTION = 0.1


def make_inputs(size: str, dtype: torch.dtype, device: torch.device) -> tuple:
    b, t, n = SIZES[size]
    gen = torch.Generator().manual_seed(0)
    pred = torch.randn(b, t, n, generator=gen).to(device=device, dtype=dtype)
    target = torch.randn(b, t, n, generator=gen)
    target[torch.rand(b, t, n, generator=gen) < MISSING_FRACTION] = float("nan")
    weight = torch.rand(n, generator=gen) + 0.5
    return pred.requires_grad_(True), target.to(device), weight.to(device)


def _huber(kernel):
    return lambda pred, target, weight: kernel(pred, target, weight, kind="huber", delta=1.0)


BENCH_CASES = (
    KernelCase(
        name="masked_mse_loss",
        make_inputs=make_inputs,
        reference=masked_regression_loss_reference,
        kernel=masked_regression_loss,
        shape="batch 32 x time 256 x 512 instruments, weighted, 10 % missing",
        meta_kernel=lambda p, t, w: _fwd_op(p, t, w, "mse", 1.0),
    ),
    KernelCase(
        name="masked_huber_loss",
        make_inputs=make_inputs,
        reference=_huber(masked_regression_loss_reference),
        kernel=_huber(masked_regression_loss),
        shape="batch 32 x time 256 x 512 instruments, weighted, 10 % missing",
        meta_kernel=lambda p, t, w: _fwd_op(p, t, w, "huber", 1.0),
    ),
)
