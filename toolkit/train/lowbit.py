"""Low-bit AdamW: the optimizer states m and v held block-wise quantised (torchao.optim).

Which library and why (measurements in docs/kernels.md, "Low-bit optimizer states"):
torchao's optimizers work on CPU and GPU alike (pure PyTorch ops on a tensor subclass, no
CUDA-only kernels), accept FSDP2's DTensor parameters (each rank quantises its own dim-0
shard; the state is a DTensor over the subclass), and are deterministic (round to nearest),
which makes a resume bitwise exact. bitsandbytes' 8-bit AdamW reads raw pointers of plain
CUDA tensors: no DTensor parameters, and its per-rank state tensors are not DTensors, so DCP
would save one rank's copy as if replicated.

- adamw8bit: torchao AdamW8bit, 8-bit dynamic-tree codes per element, one fp32 scale per
  256-element block (Dettmers et al. 2021, arXiv:2110.02861).
- adamw_lowmem: torchao AdamW4bit, 4-bit codes (two per byte), one fp32 scale per
  128-element block (Li et al. 2023, arXiv:2309.01507): the lowest-memory state that still
  trains as well as fp32 AdamW on our presets (docs/kernels.md).

Like bitsandbytes, torchao quantises only a state whose (local) tensor has >= 4096 elements
and a multiple of the block size; smaller ones (norms, biases, small shards) stay fp32.

The library compiles its per-parameter step with torch.compile. On CPU that costs ~1 minute
for gpt_small on 2 cores with a cold inductor cache (C++ codegen, g++) and then steps ~5x
faster than eager, so `optim.compile_step` defaults to "on CUDA only" (tests and short CPU
runs stay eager); the eager path runs the same update on the same subclass, op by op.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from toolkit.train.lowbit_state import keep_plain_in_state_dict


@dataclass(frozen=True)
class StateFormat:
    """How one optimizer name stores m and v: bits per element and elements per fp32 scale
    (block size); `library` names where the numbers come from."""

    bits: int
    block_size: int
    library: str

    def bytes_per_param(self) -> float:
        """m + v bytes per parameter of a quantised tensor: codes plus the block's scale."""
        return 2 * (self.bits / 8 + 4 / self.block_size)


# Source: torchao 0.18.0 torchao/optim/adam.py (AdamW8bit block_size=256, AdamW4bit
# block_size=128), subclass_8bit.py / subclass_4bit.py (uint8 codes, 2 per byte for 4-bit;
# one fp32 scale per block). Plain AdamW: fp32 m and v (torch.optim.AdamW).
FORMATS: dict[str, StateFormat] = {
    "adamw": StateFormat(bits=32, block_size=0, library="torch.optim.AdamW"),
    "adamw8bit": StateFormat(bits=8, block_size=256, library="torchao.optim.AdamW8bit"),
    "adamw_lowmem": StateFormat(bits=4, block_size=128, library="torchao.optim.AdamW4bit"),
}
# torchao (like bitsandbytes) keeps a state fp32 below this many elements per local tensor.
MIN_QUANTIZED_NUMEL = 4096


def state_bytes_per_param(name: str) -> float:
    """Optimizer state bytes per parameter (m + v) for `optim.name`, for the performance model:
    8.0 for fp32 AdamW, 2.03125 for adamw8bit, 1.0625 for adamw_lowmem. Exact for a tensor
    that is quantised (>= 4096 elements per shard, a multiple of the block size); small
    tensors keep fp32 state (8 B/param), negligible in the models we size. Excludes the
    per-tensor step counter and the 8-bit code table (1 KiB per state tensor)."""
    fmt = FORMATS[name]
    if fmt.block_size == 0:
        return 2 * fmt.bits / 8
    return fmt.bytes_per_param()


def is_quantized(local_numel: int, name: str) -> bool:
    """Whether torchao quantises a state of this many elements (per rank) for `name`."""
    block = FORMATS[name].block_size
    return block > 0 and local_numel >= MIN_QUANTIZED_NUMEL and local_numel % block == 0


def build_lowbit(
    groups: list[dict[str, Any]],
    name: str,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    compile_step: bool,
) -> torch.optim.Optimizer:
    """torchao's optimizer for `name` over `groups`, with its checkpoint boundary (states
    saved and loaded as plain fp32 tensors: toolkit.train.lowbit_state) and the step
    compiled or eager (`compile_step`)."""
    from torchao.optim import AdamW4bit, AdamW8bit  # the kernels extra; imported on use

    classes = {"adamw8bit": AdamW8bit, "adamw_lowmem": AdamW4bit}
    optimizer = _with_step(classes[name])(
        groups, lr=lr, betas=betas, eps=eps, block_size=FORMATS[name].block_size
    )
    optimizer.compile_step = compile_step
    keep_plain_in_state_dict(optimizer)
    return optimizer


_CLASSES: dict[type, type] = {}


def _with_step(base: type) -> type:
    """`base` (a torchao _AdamBase) with its step loop restated so that the per-parameter
    update `single_param_adam` runs compiled (the library's way) or eagerly: torchao always
    compiles, with fullgraph=True, which refuses to run with dynamo disabled. The loop is
    torchao 0.18.0's `_AdamBase.step` (state init, step count, the update's arguments)."""
    if base not in _CLASSES:
        methods = {"step": _step, "add_param_group": _add_param_group}
        _CLASSES[base] = type(f"Steppable{base.__name__}", (base,), methods)
    return _CLASSES[base]


def _add_param_group(self: Any, param_group: dict[str, Any]) -> None:
    """torch's own: lr stays a float, as with torch.optim.AdamW, so that the scheduler, the
    step records and the JSON train state see a number (torchao turns it into a tensor, for
    its compiled step; `_step` hands the step a tensor)."""
    torch.optim.Optimizer.add_param_group(self, param_group)


@torch.no_grad()
def _step(self: Any, closure: Any = None) -> Any:
    from torchao.optim.adam import single_param_adam

    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    update = single_param_adam
    if self.compile_step:
        update = torch.compile(single_param_adam, fullgraph=True, dynamic=False)
    with torch._dynamo.utils.disable_cache_limit():  # one graph per shard shape, by design
        for group in self.param_groups:
            # a tensor: a float would be a constant of the compiled graph (one per lr value)
            lr = torch.tensor(group["lr"], dtype=torch.float32)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = self._new_buffer(p, True)
                    state["exp_avg_sq"] = self._new_buffer(p, False)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = self._new_buffer(p, False)
                state["step"] += 1
                update(
                    p.detach(),  # torchao: compile + FSDP2 need the detached DTensor
                    p.grad,
                    state["step"],
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    state.get("max_exp_avg_sq", None),
                    lr,
                    group["betas"][0],
                    group["betas"][1],
                    group["weight_decay"],
                    group["eps"],
                    self.is_adamw,
                    self.bf16_stochastic_round and p.dtype is torch.bfloat16,
                )
    return loss


def state_tensors(optimizer: torch.optim.Optimizer) -> Iterable[tuple[str, torch.Tensor]]:
    """(key, local tensor) of every m/v state this rank holds, as the optimizer holds it
    (a quantised subclass or plain fp32)."""
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                value = state[key]
                yield key, value.to_local() if hasattr(value, "to_local") else value


def local_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of m and v this rank holds, measured from the real tensors: codes and scales
    of a quantised state (not its 'appearance' dtype), the storage of a plain one."""
    total = 0
    for _, tensor in state_tensors(optimizer):
        if hasattr(tensor, "codes"):
            total += sum(
                t.numel() * t.element_size() for t in (tensor.codes, tensor.scale, tensor.qmap)
            )
        else:
            total += tensor.numel() * tensor.element_size()
    return total
