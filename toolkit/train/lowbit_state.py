"""The checkpoint boundary of the low-bit optimizers: their m and v leave `state_dict()` as
plain fp32 tensors and are quantised again by `load_state_dict()`.

Why not let DCP save torchao's tensor subclasses directly: DCP would torch.save (pickle) the
subclass into each shard, readable only because torchao adds its classes to torch's global
weights_only allow-list, and bound to torchao's private layout (codes, scale, qmap); our
async staging copies tensor storages, which a wrapper subclass does not have; and a state
that is quantised on one world size may be plain on another (torchao quantises only shards
of >= 4096 elements), so shards saved on 2 ranks would not fit the tensors of 1 rank.

Saved as fp32, a low-bit optimizer's checkpoint has the layout of plain AdamW's (DTensors
sharded on dim 0 like the parameters): DCP reshards it like any other, the trusted loader
(toolkit.checkpoint.trust) reads it, and nothing in toolkit.checkpoint changes. The cost is
disk: 8 bytes per parameter for m + v instead of ~2 (8-bit) or ~1 (4-bit).

Exactness: only the dequantised values of a state matter to the next step (it dequantises,
updates in fp32 and quantises afresh), so a load that finds codes and scales dequantising to
exactly the saved values continues bitwise (`quantize_exactly`; the library's own copy_ does
not, see there). tests/train/test_lowbit_optim.py checks the values bit for bit and the
losses of a resumed run. Resharding 2 -> 1 rank: FSDP2 shards on dim 0, so a
rank's shard is a contiguous run of the flattened tensor, and torchao's blocks are
`block_size` consecutive elements of the local shard. When every shard's size is a multiple
of the block size (all quantised shards are: torchao requires it), the blocks of the
concatenated shards are the blocks of the whole tensor and the same scales come back: the
reshard is exact. A tensor that was plain fp32 on 2 ranks (shard < 4096 elements) but is
quantised on 1 is quantised on load, rounding its m and v to the format once (the error of
one quantisation step, as after any optimizer step).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)

STATE_KEYS = {"exp_avg": True, "exp_avg_sq": False, "max_exp_avg_sq": False}  # key -> signed


def is_low_bit(tensor: torch.Tensor) -> bool:
    """True for a torchao quantised state (or a DTensor over one)."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return hasattr(local, "dequantize") and hasattr(local, "codes")


def to_plain(tensor: torch.Tensor) -> torch.Tensor:
    """The fp32 values of a quantised state, with the same DTensor placement (and shape)."""
    if isinstance(tensor, DTensor):
        local = tensor.to_local()
        plain = local.dequantize().view(local.shape)
        return DTensor.from_local(
            plain,
            device_mesh=tensor.device_mesh,
            placements=tensor.placements,
            run_check=False,
            shape=tensor.shape,
            stride=tensor.stride(),
        )
    return tensor.dequantize().view(tensor.shape)


def _plain_state_dict(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """state_dict post-hook: quantised states replaced by fresh fp32 tensors. The per-parameter
    dicts of `state_dict()` are the optimizer's own: replaced by copies, never modified."""
    states = state_dict["state"]
    for index, state in states.items():
        if any(is_low_bit(v) for k, v in state.items() if k in STATE_KEYS):
            states[index] = {
                k: to_plain(v) if k in STATE_KEYS and is_low_bit(v) else v for k, v in state.items()
            }


def _store_codes(local: torch.Tensor, codes: torch.Tensor, rows: torch.Tensor) -> None:
    """Writes the (blocks, block_size) `codes` of the blocks selected by `rows` (bool)."""
    packed = codes.to(torch.uint8)
    if local.codes.numel() * 2 == local.numel():
        packed = (packed[:, 0::2] << 4) | packed[:, 1::2]
    view = local.codes.view(packed.shape[0], -1)
    view[rows] = packed[rows]


def quantize_exactly(local: torch.Tensor, values: torch.Tensor) -> int:
    """Sets the quantised `local` (torchao 8- or 4-bit state) to `values` (fp32, same shape)
    so that it dequantises to exactly `values` wherever they came from such a state with the
    same blocks. Returns the number of blocks that could not be reproduced, which keep the
    library's own (rounding) quantisation.

    Why not the library's `copy_`: it takes each block's scale as the block's largest |value|,
    but a signed code table has +1 and no -1 (torchao, like bitsandbytes: the negative end is
    -0.99...), so a block whose largest element is negative dequantised to 0.99.. x scale, and
    quantising that again picks a smaller scale and other codes. Only the dequantised values
    matter to the next step (it dequantises, updates in fp32 and quantises afresh), so finding
    any scale and codes that reproduce them bitwise is exact. Candidate scales: the block's
    largest value / qmap[-1], its smallest / qmap[0] and that one's nearest fp32 neighbours
    (the division need not invert the product); per block the first candidate that
    reproduces every value is kept."""
    local.copy_(values)  # the library's quantisation: the fallback for blocks not reproduced
    x = values.reshape(-1, local.block_size).float()
    qmap = local.qmap
    midpoints = (qmap[:-1] + qmap[1:]) / 2
    # The element that set the scale now reads qmap[-1] x scale (= scale) or qmap[0] x scale.
    from_top = x.amax(-1) / qmap[-1]
    from_bottom = x.amin(-1) / qmap[0]
    up, down = torch.full_like(from_top, float("inf")), torch.zeros_like(from_top)
    above = torch.nextafter(from_bottom, up)
    below = torch.nextafter(from_bottom, down)
    candidates = [from_top, from_bottom, above, below]
    candidates += [torch.nextafter(above, up), torch.nextafter(below, down)]
    done = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    for scale in candidates:
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.bucketize(x / safe.view(-1, 1), midpoints)
        back = qmap[codes] * scale.view(-1, 1)
        rows = (back == x).all(-1) & ~done
        if rows.any():
            _store_codes(local, codes, rows)
            local.scale[rows] = scale[rows]
            done |= rows
    return int((~done).sum())


def _quantize_loaded(optimizer: torch.optim.Optimizer) -> None:
    """load_state_dict post-hook: each plain fp32 state the library would hold quantised (its
    own `_new_buffer` rule: local size, block size) is set into a new quantised buffer,
    exactly where the saved blocks allow (`quantize_exactly`)."""
    lossy = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            for key, signed in STATE_KEYS.items():
                if key not in state or is_low_bit(state[key]):
                    continue
                buffer = optimizer._new_buffer(p, signed)  # type: ignore[attr-defined]
                if is_low_bit(buffer):
                    value = state[key]
                    local = buffer.to_local() if isinstance(buffer, DTensor) else buffer
                    plain = value.to_local() if isinstance(value, DTensor) else value
                    lossy += quantize_exactly(local, plain.to(local.device).float())
                    state[key] = buffer
    if lossy:
        log.warning(
            "low-bit optimizer state: %d blocks re-quantised with rounding (their blocks differ "
            "from the saved ones: another world size, or a state saved unquantised)",
            lossy,
        )


def keep_plain_in_state_dict(optimizer: torch.optim.Optimizer) -> None:
    """Registers the two hooks on a torchao low-bit optimizer."""
    optimizer.register_state_dict_post_hook(_plain_state_dict)
    optimizer.register_load_state_dict_post_hook(_quantize_loaded)
