"""Optimizer state memory and step time of adamw vs adamw8bit vs adamw_lowmem.

One process, the model of `--model` (gpt_small by default) unsharded on the CPU, one
forward/backward for gradients, then optimizer steps timed round-robin over the optimizer
names (interleaved: machine noise hits all of them alike) and reported as medians. The
baseline is `adamw` (torch.optim.AdamW, foreach, fp32 states), built by the same
`build_optimizer`. State bytes are measured from the real state tensors
(toolkit.train.lowbit.local_state_bytes) and set against `state_bytes_per_param`.
`--compile` also times the library's compiled step (what runs on CUDA): its first call
(the compile) and its median step.

    python -m toolkit.bench.lowbit --rounds 7 --steps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from toolkit.config.model import GPTConfig
from toolkit.config.optim import OptimConfig
from toolkit.train.lowbit import build_lowbit, local_state_bytes, state_bytes_per_param
from toolkit.train.models import build_model
from toolkit.train.optim import build_optimizer

BASELINE = "adamw"
NAMES = ("adamw", "adamw8bit", "adamw_lowmem")
PRESETS = {  # conf/model/*.yaml, the fields the model needs
    "gpt_tiny": GPTConfig(
        name="gpt_tiny", num_layers=2, dim=64, num_heads=4, vocab_size=256, max_seq_len=256
    ),
    "gpt_small": GPTConfig(
        name="gpt_small", num_layers=4, dim=192, num_heads=6, vocab_size=256, max_seq_len=512
    ),
}


def model_with_grads(cfg: GPTConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (4, 64))
    model(tokens, tokens).backward()
    return model


def timed_steps(optimizer: torch.optim.Optimizer, steps: int) -> float:
    """Seconds per optimizer step over `steps` steps."""
    t0 = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - t0) / steps


def run(model_name: str, rounds: int, steps: int, compile_step: bool) -> None:
    cfg = PRESETS[model_name]
    models = {name: model_with_grads(cfg) for name in NAMES}
    optimizers = {name: build_optimizer(models[name], OptimConfig(name=name)) for name in NAMES}
    if compile_step:
        model = models["compiled"] = model_with_grads(cfg)
        params = [{"params": list(model.parameters())}]
        compiled = build_lowbit(
            params, "adamw8bit", lr=3e-3, betas=(0.9, 0.95), eps=1e-8, compile_step=True
        )
        t0 = time.perf_counter()
        compiled.step()
        print(f"adamw8bit compiled: first step (compile) {time.perf_counter() - t0:.1f} s")
        optimizers["adamw8bit compiled"] = compiled
    for optimizer in optimizers.values():
        optimizer.step()  # states created, nothing timed
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(rounds):
        for name, optimizer in optimizers.items():
            times[name].append(timed_steps(optimizer, steps))
    num_params = sum(p.numel() for p in models[BASELINE].parameters())
    base = statistics.median(times[BASELINE])
    load = os.getloadavg()[0]
    print(f"{model_name}: {num_params / 1e6:.2f} M params, {rounds} rounds x {steps} steps")
    print(f"load average (1 min) {load:.2f}; baseline {BASELINE}")
    print(f"{'optimizer':<20} {'state B/param':>14} {'table':>8} {'step ms':>9} {'vs adamw':>9}")
    for name, optimizer in optimizers.items():
        key = name.split()[0]
        measured = local_state_bytes(optimizer) / num_params
        median = statistics.median(times[name])
        print(
            f"{name:<20} {measured:>14.3f} {state_bytes_per_param(key):>8.3f} "
            f"{median * 1e3:>9.1f} {median / base:>8.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.lowbit")
    parser.add_argument("--model", choices=sorted(PRESETS), default="gpt_small")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps per timing")
    parser.add_argument("--compile", action="store_true", help="also the compiled 8-bit step")
    args = parser.parse_args()
    run(args.model, args.rounds, args.steps, args.compile)


if __name__ == "__main__":
    main()
