"""`toolkit bench ensemble [--ks 1,8,32] [--model ts_transformer|mlp] [--device cpu|cuda]`:
the step time of an ensemble of K members (trainer.ensemble=K: one vmap'd forward/backward,
per-member clipping, one StackedAdamW step; toolkit.train.ensemble) against K separate
steps of the same members (each its own model, clipping and torch AdamW), interleaved
A B A B over --repeats rounds, medians.

One process, one device, no data loading: the same micro-batch every step (the data path
is another benchmark's). On a CPU about 1x is expected: at these sizes the step is
compute-bound, and vmap batches the members' matmuls into bigger ones without removing
arithmetic. On a GPU a small model's step is bound by per-kernel overhead, which one
ensemble step pays once for K members: well above 1x is expected there
(scripts/gpu_check.sh runs this on CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from toolkit.config.optim import OptimConfig
from toolkit.config.trainer import TrainerConfig
from toolkit.train.ensemble import EnsembleStep, build_stack, resolve_members
from toolkit.train.ensemble_optim import MemberSchedule, StackedAdamW
from toolkit.train.models.spec import pair_loss
from toolkit.train.optim import build_optimizer

SEQ_LEN = 32
NUM_SERIES = 48
NUM_TARGETS = 16
OPTIM = OptimConfig(warmup_steps=0, schedule="constant")  # every member's: lr 3e-3, wd 0.1


class WindowMLP(nn.Module):
    """A small forecaster: the [time, series] window flattened through two hidden layers."""

    def __init__(self, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(SEQ_LEN * NUM_SERIES, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, NUM_TARGETS),
        )

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(x), targets)


def builder(model: str) -> Callable[[], nn.Module]:
    """The benchmark's model, built from the current RNG state."""
    if model == "mlp":
        return WindowMLP
    from toolkit.config.model import TimeSeriesConfig
    from toolkit.train.models.registry import spec_config, spec_for

    cfg = TimeSeriesConfig(
        num_layers=2,
        dim=64,
        num_heads=4,
        num_series=NUM_SERIES,
        num_targets=NUM_TARGETS,
        max_seq_len=SEQ_LEN,
    )
    spec = spec_for(cfg)

    def build() -> nn.Module:
        m = spec.build(spec_config(cfg))
        spec.initialise(m)
        return m

    return build


class Ensemble:
    """K members as one ensemble step."""

    def __init__(self, k: int, build: Callable[[], nn.Module], device: torch.device):
        members = resolve_members(TrainerConfig(ensemble=k), 0, OPTIM)
        self.stack = build_stack(build, members, pair_loss, device)
        alive = torch.ones(k, dtype=torch.bool)
        self.step_ = EnsembleStep(self.stack, device, alive)
        wd = [m.weight_decay for m in members]
        self.optimizer = StackedAdamW(self.stack.model, OPTIM, wd, alive)
        MemberSchedule(self.optimizer, OPTIM, 10**6, [m.lr for m in members], [0] * k)

    def step(self, batch: Any) -> torch.Tensor:
        losses = self.step_.forward_backward([batch])
        self.step_.clip_grad_norm(OPTIM.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return losses


class Separate:
    """The same K members as K models, each stepped on its own."""

    def __init__(self, k: int, build: Callable[[], nn.Module], device: torch.device):
        self.models, self.optimizers = [], []
        for seed in range(k):  # the members' seeds (resolve_members: seed + i)
            torch.manual_seed(seed)
            model = build().to(device)
            self.models.append(model)
            self.optimizers.append(build_optimizer(model, OPTIM))  # torch's foreach AdamW

    def step(self, batch: Any) -> torch.Tensor:
        losses = []
        for model, optimizer in zip(self.models, self.optimizers, strict=True):
            loss = pair_loss(model, batch)
            loss.backward()
            losses.append(loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM.grad_clip, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return torch.stack(losses)


def members_match(model: str, device: torch.device, k: int = 4, steps: int = 3) -> float:
    """The largest relative difference between K ensemble members' losses and their
    separate models' over `steps` steps (the same batch each step), in fp32 (TF32 off)."""
    build, batch = builder(model), fixed_batch(16, device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ensemble, separate = Ensemble(k, build, device), Separate(k, build, device)
        worst = 0.0
        for _ in range(steps):
            got, want = ensemble.step(batch), separate.step(batch)
            worst = max(worst, float(((got - want).abs() / want.abs()).max()))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return worst


def fixed_batch(micro_batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(micro_batch, SEQ_LEN, NUM_SERIES, generator=g).to(device)
    return x, torch.randn(micro_batch, NUM_TARGETS, generator=g).to(device)


def timed(step: Callable[[Any], Any], batch: Any, steps: int, device: torch.device) -> float:
    """Seconds per step over `steps` steps (the device synchronised at both ends)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / steps


def measure(
    k: int,
    model: str,
    device: torch.device,
    micro_batch: int,
    repeats: int,
    steps: int,
) -> dict[str, Any]:
    """Ensemble against separate steps for K members, interleaved; medians in ms."""
    build, batch = builder(model), fixed_batch(micro_batch, device)
    ensemble, separate = Ensemble(k, build, device), Separate(k, build, device)
    ensemble.step(batch)  # warm-up: allocation, the vmap check, lazy inits
    separate.step(batch)
    times: dict[str, list[float]] = {"ensemble": [], "separate": []}
    for _ in range(repeats):
        times["ensemble"].append(timed(ensemble.step, batch, steps, device))
        times["separate"].append(timed(separate.step, batch, steps, device))
    ens, sep = (statistics.median(times[n]) for n in ("ensemble", "separate"))
    return {
        "k": k,
        "model": model,
        "device": str(device),
        "micro_batch": micro_batch,
        "ensemble_step_ms": 1e3 * ens,
        "separate_steps_ms": 1e3 * sep,
        "speedup": sep / ens,
        "ensemble_samples_per_s": k * micro_batch / ens,  # member-samples
        "ensemble_ms_runs": [1e3 * t for t in times["ensemble"]],
        "separate_ms_runs": [1e3 * t for t in times["separate"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolkit bench ensemble", description=__doc__)
    parser.add_argument("--ks", default="1,8,32", help="ensemble sizes, comma-separated")
    parser.add_argument("--model", choices=("ts_transformer", "mlp"), default="ts_transformer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=5, help="steps timed per round")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    parser.add_argument(
        "--check-members",
        action="store_true",
        help="first check 4 members' losses against their separate models' over 3 steps",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        parser.error(f"--ks={args.ks}: comma-separated integers, e.g. 1,8,32")
    if any(k < 1 for k in ks) or args.repeats < 1 or args.steps < 1 or args.micro_batch < 1:
        parser.error("--ks, --repeats, --steps and --micro-batch must be >= 1")
    device = torch.device(args.device)
    report: dict[str, Any] = {}
    if args.check_members:
        report["members_max_rel_diff"] = members_match(args.model, device)
        print(
            f"4 members vs their separate models, 3 steps: losses within "
            f"{report['members_max_rel_diff']:.1e} relative"
        )
    rows = []
    print(
        f"{'K':>4} {'ensemble step':>14} {'K separate':>12} {'speedup':>8} "
        f"{'member-samples/s':>17}   ({args.model}, {device}, micro-batch {args.micro_batch}, "
        f"medians of {args.repeats} interleaved rounds)"
    )
    for k in ks:
        row = measure(k, args.model, device, args.micro_batch, args.repeats, args.steps)
        rows.append(row)
        print(
            f"{k:>4} {row['ensemble_step_ms']:>11.2f} ms {row['separate_steps_ms']:>9.2f} ms "
            f"{row['speedup']:>7.2f}x {row['ensemble_samples_per_s']:>17,.0f}",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(json.dumps({**report, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
