"""Counted costs of any nn.Module: FLOPs, parameters and saved-activation bytes of one
forward + backward, measured by running the model once on meta tensors (no real memory).

    from toolkit.perfmodel.counted import count
    cost = count(lambda: MyLSTM(...), lambda: torch.zeros(8, 64, 48), tokens_per_sample=64)
    cost.flops_per_sample, cost.flops_per_token, cost.saved_bytes_per_sample, cost.param_bytes

How:
- The model is built under `torch.device("meta")` and the batch is made (or moved) there:
  tensors carry shapes and dtypes but no storage, so a 7B model costs no memory and each op
  only runs its shape function.
- FLOPs: torch.utils.flop_counter.FlopCounterMode over forward and backward. It counts
  matmuls (mm, addmm, bmm, baddbmm), convolutions and their backward, and the fused attention
  ops; elementwise work, norms and softmax are not counted (model FLOPs, as in MFU).
  nn.LSTM / nn.GRU on meta tensors run their composite form (one addmm per gate matmul and
  time step), so they are counted exactly; on real CPU tensors they run a fused kernel
  (mkldnn_rnn) that the counter does not see (0 FLOPs), which is one reason counting runs on
  meta. CUDA's fused cell (_thnn_fused_lstm_cell) takes the gate matmuls as inputs and does
  only elementwise work, so no formula is missing for it.
- Attention: with `fused_attention` (the default) F.scaled_dot_product_attention without a
  mask runs as the flash-attention op (aten._scaled_dot_product_flash_attention, which has
  meta kernels), as a GPU runs it: it saves q, k, v, the output and the log-sum-exp but no
  seq x seq matrix. Its forward is counted as 4*b*h*s_q*s_k*d (the full score matrix, also
  when causal, as the analytic 12*L*d*S); its backward as twice that: model FLOPs, without
  the flash backward's recomputation of the scores (torch's own formula counts 2.5x).
  `fused_attention=False` keeps torch's choice on meta, the math path (bmm, and the
  attention matrix saved).
- Saved activations: torch.autograd.graph.saved_tensors_hooks records each tensor autograd
  saves for backward during the forward, deduplicated by storage (q, k and v views of one
  qkv tensor count once, at the storage's size); parameters, buffers and the batch itself are
  left out (they are held anyway).
- Ops: every aten op forward and backward dispatch (`OpCounter`, a TorchDispatchMode: views,
  detaches and transposes included), the count the performance model charges a per-op
  cost for (toolkit.perfmodel.counted_model: the launch floor of a small model). A model of
  at most REAL_OPS_MAX_PARAMS parameters is run once more on real CPU tensors for this
  count (`cpu_ops`, the RNG state kept): eager runs nn.LSTM / nn.GRU as one fused kernel
  where meta runs their composite form (ops per gate and time step: 8,080 against 53 for
  a 2-layer LSTM over 64 steps). A larger model keeps the meta count, an upper bound for
  RNNs, where the floor is small beside its arithmetic anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from toolkit.errors import UserError
from toolkit.train.models.spec import Batch, LossFn, batch_size, to_device

META = torch.device("meta")
REAL_OPS_MAX_PARAMS = 20_000_000  # 80 MB of fp32 parameters: cheap to build on the CPU
CPU_OPS_SAMPLES = 2  # samples of the batch the CPU's op count runs
aten = torch.ops.aten


@dataclass(frozen=True)
class CountedCost:
    """One forward + backward of a batch of `batch_size` samples, as counted."""

    batch_size: int
    flops: float  # forward + backward of the batch
    forward_flops: float
    num_params: int
    param_bytes: int
    saved_bytes: int  # saved for backward over the batch (activations only)
    tokens_per_sample: int | None = None
    flops_by_op: dict[str, int] = field(default_factory=dict)
    ops: int = 0  # aten ops dispatched by the forward + backward (OpCounter)
    param_tensors: int = 0  # parameter tensors (the optimizer's foreach ops run per tensor)

    @property
    def flops_per_sample(self) -> float:
        return self.flops / self.batch_size

    @property
    def forward_flops_per_sample(self) -> float:
        return self.forward_flops / self.batch_size

    @property
    def flops_per_token(self) -> float | None:
        """FLOPs per token when the caller said how many tokens a sample is."""
        if not self.tokens_per_sample:
            return None
        return self.flops_per_sample / self.tokens_per_sample

    @property
    def saved_bytes_per_sample(self) -> float:
        return self.saved_bytes / self.batch_size

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "tokens_per_sample": self.tokens_per_sample,
            "flops_per_sample": self.flops_per_sample,
            "forward_flops_per_sample": self.forward_flops_per_sample,
            "flops_per_token": self.flops_per_token,
            "num_params": self.num_params,
            "param_bytes": self.param_bytes,
            "saved_bytes_per_sample": self.saved_bytes_per_sample,
            "flops_by_op": dict(self.flops_by_op),
            "ops": self.ops,
            "param_tensors": self.param_tensors,
        }


def count(
    build: Callable[[], nn.Module],
    batch: Batch | Callable[[], Batch],
    loss: LossFn | None = None,
    *,
    tokens_per_sample: int | None = None,
    dtype: torch.dtype | None = None,
    fused_attention: bool = True,
) -> CountedCost:
    """Count one forward + backward of `build()`'s model on `batch` (a tensor, or a tuple,
    list or dict of tensors with the batch as leading dimension; or a function making one,
    called on the meta device). `loss(model, batch)` gives the scalar to differentiate
    (default: `output_loss`). `dtype` casts the parameters and floating inputs (bytes then
    follow it). Raises UserError when the model holds real tensors (built with an explicit
    device) and TypeError when the batch holds none."""
    with torch.device(META):
        model = build()
        made = batch() if callable(batch) else batch
    if dtype is not None:
        model = model.to(dtype)
    real = [name for name, t in _state(model) if t.device != META]
    if real:
        raise UserError(
            f"count: {real[0]} is on {dict(_state(model))[real[0]].device}, not meta: create "
            "the model's tensors without an explicit device so that they follow the default"
        )
    made = _cast(to_device(made, META), dtype)
    num_samples = batch_size(made)
    held = {_storage_key(t) for _, t in _state(model)} | {_storage_key(t) for t in _tensors(made)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in held:
            saved[key] = max(saved.get(key, 0), t.untyped_storage().nbytes())
        return t

    loss_fn = loss or output_loss
    mapping = {aten._scaled_dot_product_flash_attention_backward: attention_backward_flops}
    counter = FlopCounterMode(display=False, custom_mapping=mapping)
    attention = FusedAttention() if fused_attention else contextlib.nullcontext()
    ops = OpCounter()
    with counter, ops:
        with attention, torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            value = loss_fn(model, made)
        forward = counter.get_total_flops()
        if value.dim():
            raise UserError(f"count: the loss has shape {tuple(value.shape)}, not a scalar")
        value.backward()
    params = dict(model.named_parameters())  # shared (tied) parameters once
    num_params = sum(p.numel() for p in params.values())
    real_ops = cpu_ops(build, batch, loss_fn, dtype) if num_params <= REAL_OPS_MAX_PARAMS else 0
    return CountedCost(
        batch_size=num_samples,
        flops=float(counter.get_total_flops()),
        forward_flops=float(forward),
        num_params=num_params,
        param_bytes=sum(p.numel() * p.element_size() for p in params.values()),
        saved_bytes=sum(saved.values()),
        tokens_per_sample=tokens_per_sample,
        flops_by_op={str(op): n for op, n in counter.get_flop_counts()["Global"].items()},
        ops=real_ops or ops.count,
        param_tensors=len(params),
    )


@dataclass(frozen=True)
class Workload:
    """What `count` runs, as one value: the model's builder, an example batch (or a function
    making one on the meta device), the loss, and the tokens in a sample (if any)."""

    build: Callable[[], nn.Module]
    batch: Batch | Callable[[], Batch]
    loss: LossFn | None = None
    tokens_per_sample: int | None = None

    def count(self, **options: Any) -> CountedCost:
        """`count` of this workload (options: dtype, fused_attention)."""
        return count(
            self.build, self.batch, self.loss, tokens_per_sample=self.tokens_per_sample, **options
        )


def output_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The default: call the model with the batch (a tuple or list as positional arguments,
    a dict as keyword arguments, a tensor as the one argument) and take its output as the
    loss: a scalar as it is, an object with `.loss` (Hugging Face), the first element of a
    tuple; a non-scalar tensor is summed (a stand-in loss, one elementwise op)."""
    if isinstance(batch, dict):
        out = model(**batch)
    elif isinstance(batch, list | tuple):
        out = model(*batch)
    else:
        out = model(batch)
    if getattr(out, "loss", None) is not None:
        out = out.loss
    if isinstance(out, list | tuple):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise UserError(f"count: the model returned a {type(out).__name__}; pass a loss function")
    return out if out.dim() == 0 else out.float().sum()


def cpu_ops(
    build: Callable[[], nn.Module],
    batch: Batch | Callable[[], Batch],
    loss: LossFn,
    dtype: torch.dtype | None,
) -> int:
    """The aten ops one forward + backward dispatches on real CPU tensors (what eager runs:
    fused RNN kernels among them), on the batch's first CPU_OPS_SAMPLES samples (the count
    does not grow with the batch; the time does); 0 where the model or batch cannot run
    there (a batch given as meta tensors, a CUDA-only op, an error of the model's). The
    caller's RNG state is left as it was."""
    cpu = torch.device("cpu")
    counter = OpCounter()
    try:
        with torch.random.fork_rng(devices=[]), torch.device(cpu):
            model = build()
            made = batch() if callable(batch) else batch
            if dtype is not None:
                model = model.to(dtype)
            made = _cast(to_device(_first(made, CPU_OPS_SAMPLES), cpu), dtype)
            with counter:
                loss(model, made).backward()
    except Exception:  # noqa: BLE001 - your model's own error: the meta count stands
        return 0
    return counter.count


def _first(batch: Batch, n: int) -> Batch:
    """The batch's first n samples (the leading dimension of every tensor)."""
    if isinstance(batch, torch.Tensor):
        return batch[:n] if batch.dim() else batch
    if isinstance(batch, dict):
        return {k: _first(v, n) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        cut = [_first(v, n) for v in batch]
        return cut if isinstance(batch, list) else tuple(cut)
    return batch


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active (forward and backward alike)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class FusedAttention(TorchFunctionMode):
    """Run F.scaled_dot_product_attention without a mask as the flash-attention op (what a
    GPU runs; it has meta kernels), so that what it saves and counts is the fused kernel's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            fused = flash_attention(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The flash op's output, or None where it does not apply (a mask, grouped heads, heads
    of another shape): then torch's own dispatch runs."""
    if attn_mask is not None or enable_gqa or query.dim() != 4:
        return None
    if query.shape[:2] != key.shape[:2] or key.shape != value.shape:
        return None
    out = aten._scaled_dot_product_flash_attention(
        query, key, value, dropout_p, is_causal, False, scale=scale
    )
    return out[0]


def attention_backward_flops(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    """Model FLOPs of attention's backward: twice its forward (dQ, dK from dS; dV, dP),
    without the flash backward's recomputation of the scores."""
    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _state(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _storage_key(t: torch.Tensor) -> int:
    # Meta storages have no data pointer (0 for all); the StorageImpl's address tells them
    # apart, and views share it. Saved tensors stay alive until backward, so no address is
    # reused while the forward runs.
    return t.untyped_storage()._cdata


def _tensors(batch: Batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, list | tuple):
        return [t for v in batch for t in _tensors(v)]
    return []


def _cast(batch: Batch, dtype: torch.dtype | None) -> Batch:
    if dtype is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast(v, dtype) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        cast = [_cast(v, dtype) for v in batch]
        return cast if isinstance(batch, list) else tuple(cast)
    return batch


if __name__ == "__main__":  # `python -m toolkit.perfmodel.counted`: the command line's alias
    import runpy

    runpy.run_module("toolkit.perfmodel.count_cli", run_name="__main__", alter_sys=True)
