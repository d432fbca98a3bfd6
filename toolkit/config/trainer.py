"""The training loop's own knobs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerConfig:
    steps: int = 300
    micro_batch_size: int = 8  # sequences per rank per micro-step
    grad_accum: int = 1
    # Sequences per optimizer step over all ranks. None: micro_batch_size * grad_accum * world.
    # When set, it wins: micro_batch_size becomes global / (world * grad_accum).
    global_batch_size: int | None = None
    log_every: int = 10
    eval_every: int = 0  # 0: evaluate only at the end
    eval_batches: int = 4
    # Stop early once the validation loss reaches this (time-to-target); None: run all steps.
    target_val_loss: float | None = None
    time_budget_s: float | None = None
    progress: bool = True  # rich progress bar on rank 0
    fail_at_step: int | None = None  # fault injection for tests: raise on fail_rank at this step
    fail_rank: int = 0
