"""What the training loop tells the instruments that watch it, at its fixed points.

The hang watchdog's heartbeat (the phase the loop enters), fault injection's points (data
wait, step start, compute, before the step's all-reduce) and the communication timer's
per-step bookkeeping sit behind one object, so that `Trainer.fit` reads as the loop. Every
call is a no-op for what is not configured.
"""

from __future__ import annotations

from toolkit.config.fault import FaultConfig
from toolkit.distributed.commtime import CommTimer
from toolkit.train.faults import FaultInjector
from toolkit.train.parts import Heartbeat, StepTiming, breakdown


class Watch:
    def __init__(
        self,
        fault: FaultConfig,
        rank: int,
        comm_timer: CommTimer | None = None,
        heartbeat: Heartbeat | None = None,
    ):
        self.faults = FaultInjector(fault, rank)
        self.comm_timer = comm_timer
        self.heartbeat = heartbeat

    def phase(self, name: str, step: int, started: bool) -> None:
        """The loop enters `name` at `step`; before its first step completes (`started`
        false), every phase counts as startup (compilation, first allocations, the load)."""
        if self.heartbeat is not None:
            self.heartbeat.beat(name if started else "startup", step)

    def data_fetched(self) -> None:
        self.faults.data_wait()

    def step_starts(self, step: int) -> None:
        self.faults.step_start(step)
        if self.comm_timer is not None:
            self.comm_timer.take()  # eval and hooks between steps: not this step's

    def compute(self) -> None:
        self.faults.compute()

    def before_all_reduce(self, step: int) -> None:
        self.faults.before_all_reduce(step)

    def exposed_s(self) -> float:
        """Communication exposed so far in this step."""
        return self.comm_timer.exposed_s if self.comm_timer is not None else 0.0

    def breakdown(self, timing: StepTiming, step_time: float, data_wait: float) -> dict:
        return breakdown(timing, step_time, data_wait, self.comm_timer)

    def uninstall(self) -> None:
        if self.comm_timer is not None:
            self.comm_timer.uninstall()
