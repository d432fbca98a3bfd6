"""Liger-Kernel's fused kernels where this GPT can use them (`model.kernels=liger|auto`).

Two kernels are adopted, each behind a plain function with its PyTorch reference beside it:

* `fused_linear_cross_entropy(hidden, weight, targets)`: the head's matmul and the
  cross-entropy in one chunked pass over the tokens. The full logits [tokens, vocab] are never
  built: each chunk's logits are turned into the loss and its gradient at once, and the
  gradients of `hidden` and `weight` are computed in the forward and kept for the backward.
* `layer_norm(x, weight, bias, eps)`: one Triton program per row (forward) and per group of
  rows (backward), statistics and weight/bias gradients accumulated in float32.

Liger's fused MLPs (SwiGLU, GeGLU) are gated: they fuse gate * act(up), which this model
does not have (its MLP is fc -> GELU(tanh) -> proj), so the MLP stays PyTorch (docs/kernels.md).

Liger imports Triton, which reads TRITON_INTERPRET when it is first imported: the library is
imported on first use, never when this module is.

Memory fact for the performance model (toolkit.perfmodel): with the fused path and targets,
the logits [tokens, vocab] (compute dtype) and their float32 copy in the loss are not kept
for backward, nor ever built whole; see `fused_ce_bytes`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

from toolkit.errors import EXIT_RESUME_REFUSED, UserError
from toolkit.kernels.backend import importable, interpret_mode, triton_runs_on
from toolkit.kernels.cases import KernelCase
from toolkit.kernels.checks import TP_REASON, liger_problem

IGNORE_INDEX = -100  # F.cross_entropy's default, and Liger's: such targets add no loss
# The activation the fused path never keeps (nor builds whole): for toolkit.perfmodel.
FUSED_CE_DROPS = "logits"


# --- the kernels -------------------------------------------------------------------------


def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, in float32, without
    building the logits. hidden [..., dim] in the compute dtype, weight [vocab, dim], targets
    [...] (IGNORE_INDEX: no loss, not counted in the mean). The weight's gradient is
    accumulated over the chunks in float32 and returned in the weight's dtype."""
    flce, _ = _ops()
    loss = flce.apply(
        hidden.flatten(0, -2),
        weight,
        targets.flatten(),
        None,  # bias
        None,  # class weights
        IGNORE_INDEX,
        0.0,  # lse_square_scale (z-loss)
        0.0,  # label_smoothing
        "mean",
        None,  # softcap
        False,  # return_z_loss
        torch.float32,  # accum_dtype of the weight gradient over chunks
    )[0]
    return loss


def reference_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The numerics contract: logits in the compute dtype, cross-entropy in float32 (as
    toolkit.train.models.gpt.gpt_loss)."""
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dim (Liger's kernel): statistics in float32, output in x's
    dtype, as F.layer_norm."""
    _, ln = _ops()
    return ln.apply(x, weight, bias, _scalar(eps))


def reference_layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def fused_ce_bytes(tokens: int, dim: int, vocab: int, compute_bytes: int) -> dict[str, int]:
    """Bytes of the fused path (for the performance model), per micro-batch on one rank.

    kept: what lives from forward to backward (the gradients of hidden and of the weight,
    in the compute dtype), instead of the logits [tokens, vocab] and their float32 copy.
    transient: the peak inside the forward: one chunk of logits (Liger bounds a chunk to
    about tokens x dim elements: chunk rows = next power of two of tokens / ceil(vocab /
    dim)) plus the float32 accumulator of the weight's gradient."""
    chunks = math.ceil(vocab / dim)
    rows = min(tokens, 1 << max(0, math.ceil(tokens / chunks) - 1).bit_length())
    return {
        "kept": (tokens * dim + vocab * dim) * compute_bytes,
        "transient": rows * vocab * compute_bytes + vocab * dim * 4,
    }


# --- which kernels run -------------------------------------------------------------------


def resolve(requested: str, device: torch.device | str, reasons: list[str], tp: int = 1) -> str:
    """ "torch" or "liger" for model.kernels=`requested` on `device`; appends why to
    `reasons`. `liger` where it cannot run is the user's to fix: one line, what to do."""
    if requested == "torch":
        reasons.append("model.kernels=torch")
        return "torch"
    installed = importable("liger_kernel") and importable("triton")
    if requested == "auto":
        if tp > 1:
            reasons.append(f"auto: torch, {TP_REASON}")
            return "torch"
        if torch.device(device).type != "cuda":
            reasons.append(f"auto: torch, the model runs on {torch.device(device).type}, not CUDA")
            return "torch"
        if not installed:
            reasons.append("auto: torch, liger-kernel is not installed")
            return "torch"
        reasons.append("auto: liger, liger-kernel is installed and CUDA runs the model")
        return "liger"
    problem = liger_problem(installed, triton_runs_on(device), tp)
    if problem:
        raise UserError(problem, EXIT_RESUME_REFUSED)
    reasons.append(f"model.kernels=liger on {torch.device(device).type}")
    return "liger"


# --- Liger, imported on first use ----------------------------------------------------------


@functools.cache
def _ops() -> tuple[Any, Any]:
    from liger_kernel.ops import layer_norm as ln
    from liger_kernel.ops.fused_linear_cross_entropy import (
        LigerFusedLinearCrossEntropyFunction,
    )

    if interpret_mode():
        _patch_for_interpreter(ln)
    return LigerFusedLinearCrossEntropyFunction, ln.LigerLayerNormFunction


def _rsqrt(x):  # traced by Triton's interpreter, where tl.math is patched to run on numpy
    import triton.language as tl

    return tl.math.rsqrt(x)


def _patch_for_interpreter(ln: Any) -> None:
    """Triton 3.9's interpreter cannot run Liger 0.8.5's LayerNorm as shipped: the kernel
    calls libdevice's rsqrt, a stub that only the GPU compiler resolves (the interpreter
    returns None). Under TRITON_INTERPRET=1 only (CPU tests), it calls tl.math.rsqrt, the
    same function the interpreter implements; GPU runs are untouched."""
    ln.rsqrt = _rsqrt


def _scalar(value: float) -> Any:
    """A float kernel argument. The interpreter passes Python floats through as they are
    and Liger's LayerNorm calls `eps.to(tl.float32)`: under TRITON_INTERPRET=1 it gets the
    float32 scalar tensor the GPU compiler would make of it."""
    if not interpret_mode():
        return value
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    return tl.tensor(TensorHandle(np.array([value], dtype=np.float32), tl.float32), tl.float32)


# --- benchmark cases (toolkit.kernels.cases) -------------------------------------------------

# The gpt_125m head: 2048 tokens x dim 768 x vocab 50304; its LayerNorm over 4 x 2048 tokens.
_FLCE_SIZES = {"test": (39, 72, 257), "bench": (2048, 768, 50304)}
_NORM_SIZES = {"test": (3, 13, 72), "bench": (4, 2048, 768)}
NORM_EPS = 1e-5


def _flce_inputs(size: str, dtype: torch.dtype, device: torch.device) -> tuple:
    tokens, dim, vocab = _FLCE_SIZES[size]
    hidden = torch.randn(tokens, dim, dtype=dtype, device=device, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, dim, device=device)).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device=device)
    return hidden, weight, targets


def _norm_inputs(size: str, dtype: torch.dtype, device: torch.device) -> tuple:
    *lead, dim = _NORM_SIZES[size]
    x = torch.randn(*lead, dim, dtype=dtype, device=device, requires_grad=True)
    weight = (1 + 0.1 * torch.randn(dim, device=device)).to(dtype).requires_grad_()
    bias = (0.1 * torch.randn(dim, device=device)).to(dtype).requires_grad_()
    return x, weight, bias


BENCH_CASES = [
    KernelCase(
        name="fused_linear_cross_entropy",
        make_inputs=_flce_inputs,
        reference=reference_linear_cross_entropy,
        kernel=fused_linear_cross_entropy,
        shape="tokens 2048 x dim 768 x vocab 50304 (gpt_125m head)",
    ),
    KernelCase(
        name="layer_norm",
        make_inputs=_norm_inputs,
        reference=functools.partial(reference_layer_norm, eps=NORM_EPS),
        kernel=functools.partial(layer_norm, eps=NORM_EPS),
        shape="4 x 2048 tokens x dim 768",
    ),
]
