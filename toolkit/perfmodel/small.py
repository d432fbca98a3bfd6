"""The small-model regime (pure arithmetic): when a step is its launches, not its arithmetic.

A step of a small model on an accelerator costs a floor that does not grow with the batch or
the number of models trained in it, and work that does:

    step_s(b, K) = floor_s + K x member_s(b)

* floor_s, the **launch floor**: every op the step dispatches (the model's forward and
  backward ops per micro-step, the optimizer's foreach ops per tensor) x the per-launch cost
  of the hardware profile (`op_overhead_s`, `optimizer_op_overhead_s`), plus FSDP2's fixed
  cost per unit collective: the `overhead` term and the optimizer's per-op part
  (toolkit.perfmodel.steptime: `overhead_s`, `optimizer_launch_s`, `launches`);
* member_s(b), everything else of one model at micro-batch b: GEMMs, attention, the
  elementwise kernels, FSDP2's copies and exposed communication, the optimizer's bytes.

**Packing** (`trainer.ensemble=K`, toolkit.train.ensemble): K members of one architecture
run as one set of batched kernels (vmap over stacked parameters), so the step launches what
one model launches: one floor, K times the arithmetic (`packed_time`). The members share each
batch, so the data a rank needs per step does not grow with K.

**The bound** of a step is the largest of the floor, the members' arithmetic and the time the
data path needs for the step's samples (`bound`). While the floor dominates, the device idles
between kernels: the remedy is more arithmetic per launch, K members (`balance_ensemble`:
the smallest K whose arithmetic reaches the floor) or a larger micro-batch
(`balance_micro_batch`), as far as memory allows (`memory_ensemble`).

**Data paths**: a rank's samples/s per path, from `toolkit bench data --json FILE` where
measured (`bench_data_rates`); the device-resident gather also from its bytes
(`device_gather_rate`: one window read and written per sample at the device's elementwise
rate); never assumed where neither exists.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from toolkit.perfmodel.prediction import Prediction

# A step's terms (toolkit.perfmodel.model.TERMS). A packed step runs `overhead` once (the
# launch floor) and every other term once per member; the optimizer term holds both: its
# per-op part (`optimizer_launch_s`) is floor, its bytes per member.
STEP_TERMS = ("gemm", "attention", "elementwise", "overhead", "fsdp_copy", "communication")
STEP_TERMS += ("optimizer", "tp_communication", "pipeline_p2p", "pipeline_bubble")
MAX_MICRO_BATCH = 1 << 20  # the micro-batch search stops here
BYTES_FP32 = 4


@dataclass(frozen=True)
class StepSplit:
    """One model's step (K = 1) as floor and per-member work, seconds per step. A plain run
    shards with FSDP2, an ensemble does not (toolkit.train.ensemble: every rank holds all
    members, one all-reduce of the gradients): K > 1 pays neither FSDP2's per-unit cost
    (`fsdp_overhead_s`, part of the floor) nor its copies (`fsdp_copy_s`, per member)."""

    floor_s: float
    member_s: float
    launches: float  # ops dispatched per step (0: not counted for this model)
    fsdp_overhead_s: float = 0.0
    fsdp_copy_s: float = 0.0

    def step_s(self, k: int = 1) -> float:
        if k == 1:
            return self.floor_s + self.member_s
        return self.ensemble_floor_s + k * self.ensemble_member_s

    @property
    def ensemble_floor_s(self) -> float:
        return self.floor_s - self.fsdp_overhead_s

    @property
    def ensemble_member_s(self) -> float:
        return self.member_s - self.fsdp_copy_s

    @property
    def overhead_share(self) -> float:
        """Of one model's step, the share spent on the floor (1.0: all launches)."""
        total = self.step_s(1)
        return self.floor_s / total if total > 0 else 0.0


def split(time: dict[str, Any]) -> StepSplit:
    """A prediction's time terms (toolkit.perfmodel.steptime.step_time) as floor and work."""
    floor = float(time["overhead_s"]) + float(time["optimizer_launch_s"])
    return StepSplit(
        floor,
        float(time["step_s"]) - floor,
        float(time["launches"]),
        float(time["fsdp_overhead_s"]),
        float(time["fsdp_copy_s"]),
    )


def packed_time(time: dict[str, Any], k: int) -> dict[str, Any]:
    """The step's terms for K members packed in one step: the floor once, the rest K times
    (the optimizer's per-op part once, its bytes K times), without FSDP2's per-unit cost
    and copies (an ensemble is not sharded); the dominant term again."""
    if k == 1:
        return dict(time)
    out = dict(time)
    out["overhead_s"] = float(time["overhead_s"]) - float(time["fsdp_overhead_s"])
    out["fsdp_overhead_s"] = out["fsdp_copy_s"] = 0.0
    for name in (*STEP_TERMS, "checkpoint_stall"):
        if name not in ("overhead", "optimizer", "fsdp_copy") and f"{name}_s" in time:
            out[f"{name}_s"] = k * float(time[f"{name}_s"])
    launch = float(time["optimizer_launch_s"])
    out["optimizer_s"] = launch + k * (float(time["optimizer_s"]) - launch)
    whole = split(time)
    out["step_s"] = whole.step_s(k)
    out["forward_backward_s"] = out["step_s"] - out["optimizer_s"]
    out["compute_s"] = sum(float(out[f"{t}_s"]) for t in STEP_TERMS[:5])
    out["communication_total_s"] = k * float(time["communication_total_s"])
    out["dominant"] = max(STEP_TERMS, key=lambda t: float(out[f"{t}_s"]))
    out["ensemble"] = k
    return out


def packed(p: Prediction, k: int) -> Prediction:
    """The prediction for K members packed in one step (trainer.ensemble=K): time by
    `packed_time`; FLOPs and the tokens (member-tokens: what K separate runs would train)
    K times; memory: every part K times (stacked parameters, gradients, optimizer states and
    K members' activations; an upper bound, the gather buffers are not all K-fold)."""
    if k == 1:
        return p
    memory = dict(p.memory)
    for key, value in p.memory.items():
        if key.endswith("_bytes") and key != "capacity_bytes" and isinstance(value, int | float):
            memory[key] = k * value
    memory["fits"] = memory["peak_bytes"] <= memory["capacity_bytes"]
    flops = {key: k * v if key != "flops_per_token" else v for key, v in p.flops.items()}
    return replace(
        p,
        time=packed_time(p.time, k),
        flops=flops,
        memory=memory,
        tokens_per_step=k * p.tokens_per_step,
    )


def balance_ensemble(s: StepSplit) -> int:
    """The smallest K whose arithmetic reaches the floor (K x member_s >= floor_s): from
    there on a step is bound by arithmetic, and each further member costs its arithmetic,
    not another floor. 1 where one model's arithmetic already does."""
    if s.floor_s <= s.member_s:
        return 1
    if s.ensemble_member_s <= 0:
        return 1
    return max(2, math.ceil(s.ensemble_floor_s / s.ensemble_member_s - 1e-9))


def memory_ensemble(peak_bytes: float, capacity_bytes: float) -> int:
    """The most members whose memory fits (K x one model's peak <= capacity; `packed`'s
    upper bound); 0 where one model does not fit."""
    return int(capacity_bytes // peak_bytes) if peak_bytes > 0 else 0


def balance_micro_batch(
    predict_at: Callable[[int], Prediction], start: int, limit: int = MAX_MICRO_BATCH
) -> int | None:
    """The smallest power-of-two multiple of `start` (doubling) at which one model's
    arithmetic reaches its floor and the step still fits; None where none up to `limit`
    does (memory runs out first, or the floor never is reached)."""
    b = start
    while b <= limit:
        p = predict_at(b)
        if not p.fits:
            return None
        s = split(p.time)
        if s.member_s >= s.floor_s:
            return b
        b *= 2
    return None


def device_gather_rate(bytes_per_sample: float, memory_bandwidth: float, fraction: float) -> float:
    """Samples/s of cutting windows out of a device-resident tensor: each sample's bytes
    read once and written once into the batch, at the device's elementwise rate."""
    return memory_bandwidth * fraction / (2.0 * bytes_per_sample)


def window_bytes(seq_len: int, inputs: int, targets: int, dtype_bytes: int = BYTES_FP32) -> float:
    """Bytes of one sample of a windowed series: seq_len x inputs, plus its targets."""
    return float((seq_len * inputs + targets) * dtype_bytes)


DEVICE_PATH = "device (data.placement=device)"
LOADER_PATH = "loader"  # today's host loader (DataLoader workers)


def bench_data_rates(result: dict[str, Any]) -> dict[str, float]:
    """Samples/s per data path from one `toolkit bench data --json` result (plain JSON):
    the host loader's best row of `results` (per format and worker count), and with
    `--paths` the medians of `paths.median_samples_per_s`: host_loader and device_resident
    (the device path where it ran on a GPU; measured on a CPU it is named so: a CPU's rate
    says nothing of a GPU's). The gather bound is a bound, not a path."""
    rates: dict[str, float] = {}

    def take(name: str, rate: Any) -> None:
        if isinstance(rate, int | float) and math.isfinite(rate) and rate > 0:
            rates[name] = max(rates.get(name, 0.0), float(rate))

    if not isinstance(result, dict):
        return rates
    rows = result["results"] if isinstance(result.get("results"), list) else []
    for row in rows:
        if isinstance(row, dict) and "samples_per_s" in row:
            take(LOADER_PATH, row["samples_per_s"])
    paths = result["paths"] if isinstance(result.get("paths"), dict) else {}
    medians = paths.get("median_samples_per_s")
    if isinstance(medians, dict):
        where = str(paths.get("device", "cpu"))
        device = DEVICE_PATH if where.startswith("cuda") else f"device-resident, on {where}"
        take(LOADER_PATH, medians.get("host_loader"))
        take(device, medians.get("device_resident"))
    return rates


@dataclass(frozen=True)
class Advice:
    """What bounds a small model's step and what to change: the line to print and its
    numbers (for --json and tests)."""

    bound: str  # "overhead", "arithmetic", "data" or "memory"
    ensemble: int  # recommended trainer.ensemble
    micro_batch_size: int | None  # the micro-batch at which arithmetic reaches the floor
    data_path: str | None  # the data path recommended ('' where no rate is known)
    needed_samples_per_s: float  # per rank, at the recommended ensemble
    line: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "bound": self.bound,
            "ensemble": self.ensemble,
            "micro_batch_size": self.micro_batch_size,
            "data_path": self.data_path,
            "needed_samples_per_s": self.needed_samples_per_s,
            "line": self.line,
        }


def data_time_s(samples: float, rate: float) -> float:
    return samples / rate if rate > 0 else math.inf


def advise(
    s: StepSplit,
    micro_batch_size: int,
    samples_per_step: int,
    max_members: int,
    balance_b: int | None,
    rates: dict[str, float],
    fits: bool = True,
) -> Advice:
    """The bound of one model's step and the remedy: overhead-bound (the floor exceeds one
    model's arithmetic): pack K members (`balance_ensemble`, at most `max_members`) or raise
    the micro-batch to `balance_b`; data-bound (the fastest path with a rate takes longer
    for the step's samples than the packed step); else arithmetic-bound. `samples_per_step`
    is a rank's samples per step (micro-batch x accumulation; members share them)."""
    if not fits:
        return Advice("memory", 1, None, None, 0.0, "memory-bound: one model does not fit")
    k = min(balance_ensemble(s), max(1, max_members))
    step = s.step_s(k)
    needed = samples_per_step / step if step > 0 else 0.0
    path = max(rates, key=lambda n: rates[n]) if rates else None
    data_s = data_time_s(samples_per_step, rates[path]) if path else 0.0
    if path and data_s > step:
        line = (
            f"data-bound: a step of {fmt_ms(step)} needs {needed:,.0f} samples/s per rank; "
            f"the fastest data path measured, {path}, delivers {rates[path]:,.0f}"
        )
        return Advice("data", k, balance_b, path, needed, line)
    if s.floor_s > s.member_s:
        launches = f": {s.launches:,.0f} launches" if s.launches else ""
        remedy = f"pack {k} members (trainer.ensemble={k}; a -m sweep: launch.pack=auto)"
        if k < balance_ensemble(s):
            remedy += f", as many as fit in memory ({balance_ensemble(s)} would balance)"
        if balance_b is not None and balance_b > micro_batch_size:
            remedy += f" or raise the micro-batch to {balance_b:,}"
        line = (
            f"overhead-bound: the launch floor ({fmt_ms(s.floor_s)}{launches}) is "
            f"{s.floor_s / max(s.member_s, 1e-12):,.0f}x one model's arithmetic "
            f"({fmt_ms(s.member_s)} at micro-batch {micro_batch_size:,}); {remedy}"
        )
        return Advice("overhead", k, balance_b, path, needed, line)
    line = (
        f"arithmetic-bound: one model's arithmetic ({fmt_ms(s.member_s)}) exceeds the launch "
        f"floor ({fmt_ms(s.floor_s)}); packing members adds their arithmetic, not speed per model"
    )
    return Advice("arithmetic", 1, micro_batch_size, path, needed, line)


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"
