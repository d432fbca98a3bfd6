"""The training loop's injected faults (the `fault` group), in one place the loop calls.

Tests and drills make a run go wrong on purpose: a crashing rank, a bad node, a slow data
loader, a slow rank, a hang. Each injection is off by default (toolkit.config.fault), and the
loop stays about training: it calls the injector at its few points, and the injector decides
from the config, this rank and this node whether anything happens there.

    data_wait()              inside the step's data wait: fault.data_delay_s
    step_start(step)         at the top of a step: fault.hang_where=outside, then
                             fault.fail_at_step / fail_rank / fail_node
    compute()                inside the step's compute: fault.straggler_rank
    before_all_reduce(step)  just before the step's all-reduce: fault.hang_where=collective

The checkpoint writer's injections (fault.save_*) live with the writer
(toolkit.checkpoint.storage), which is where they act.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from toolkit.config.fault import FaultConfig
from toolkit.distributed.env import restart_count

log = logging.getLogger(__name__)


def hang_forever(where: str, step: int, rank: int) -> None:
    """Injected hang (fault.hang_at_step): block this thread for good, like a deadlock.
    The stack dump shows this frame's name (tests look for `hang_forever`)."""
    log.warning("rank %d hangs %s after step %d (fault.hang_at_step)", rank, where, step)
    while True:
        time.sleep(1.0)


def this_node() -> str:
    """Slurm's name for this node, else the short host name (what fault.fail_node names)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


class FaultInjector:
    """One rank's injected faults; each call does nothing unless its fault is set for this
    rank (or node) and step. `step` is the number of optimizer steps completed."""

    def __init__(self, fault: FaultConfig, rank: int, node: str | None = None):
        self.fault = fault
        self.rank = rank
        self.node = node if node is not None else this_node()
        # Injected hang: in the job's first attempt only, so that a requeued job resumes
        # past it (Slurm's restart count; always 0 locally).
        self.hang_where = (
            fault.hang_where
            if fault.hang_at_step is not None and fault.hang_rank == rank and restart_count() == 0
            else None
        )
        self.straggler_sleep_s = fault.straggler_sleep_s if fault.straggler_rank == rank else 0.0

    def data_wait(self) -> None:
        """A slow data loader (fault.data_delay_s): counted as the step's data wait."""
        if self.fault.data_delay_s:
            time.sleep(self.fault.data_delay_s)

    def step_start(self, step: int) -> None:
        """At the top of a step: a hang outside collectives, then a crashing rank or node."""
        if self.hang_where == "outside" and step == self.fault.hang_at_step:
            hang_forever("outside collectives", step, self.rank)
        self.fail(step + 1)

    def fail(self, step: int) -> None:
        """fault.fail_at_step / fail_rank: a crashing rank; fault.fail_node: the ranks of that
        node fail as a bad GPU would (at fail_at_step, default the first step). `step` is the
        step about to run (1-based)."""
        if self.fault.fail_node is not None:
            if step == (self.fault.fail_at_step or 1) and self.node == self.fault.fail_node:
                raise RuntimeError(
                    f"CUDA error: uncorrectable ECC error encountered (injected on node "
                    f"{self.node} at step {step}: fault.fail_node)"
                )
        elif self.fault.fail_at_step == step and self.rank == self.fault.fail_rank:
            raise RuntimeError(f"injected failure at step {step} (fault.fail_at_step)")

    def compute(self) -> None:
        """A slow rank (fault.straggler_rank): counted as the step's compute."""
        if self.straggler_sleep_s:
            time.sleep(self.straggler_sleep_s)

    def before_all_reduce(self, step: int) -> None:
        """A rank that never reaches the step's all-reduce: the others wait in it."""
        if self.hang_where == "collective" and step == self.fault.hang_at_step:
            hang_forever("before the step's all-reduce", step, self.rank)
