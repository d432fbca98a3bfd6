"""Progress on rank 0: a rich progress bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import logging
import sys

from toolkit.events import Event, StepRecord

log = logging.getLogger(__name__)


class ConsoleSink:
    """Progress on rank 0: a rich progress bar on a terminal, plain log lines otherwise."""

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        log_every: int,
        progress: bool = True,
        unit: str = "tokens",
    ):
        self.total = total_steps
        self.unit = unit  # the model's throughput unit: tokens | samples
        self.log_every = max(1, log_every)
        self._progress = None
        if progress and sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(
                    "epoch {task.fields[epoch]}  loss {task.fields[loss]}  {task.fields[tps]}  "
                    "MFU {task.fields[mfu]}"
                ),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self._task = self._progress.add_task(
                "train",
                total=total_steps,
                completed=start_step,
                epoch="-",
                loss="-",
                tps="-",
                mfu="-",
            )
            self._progress.start()

    def _throughput(self, r: StepRecord) -> str:
        if self.unit == "tokens":
            return f"{r.tokens_per_s:,.0f} tok/s"
        return f"{r.samples_per_s:,.1f} samples/s"

    def write_step(self, r: StepRecord) -> None:
        if self._progress is not None:
            self._progress.update(
                self._task,
                completed=r.step,
                epoch=r.epoch,
                loss=f"{r.loss:.4f}",
                tps=self._throughput(r),
                mfu=f"{100 * r.mfu:.2f}%",
            )
        if r.step % self.log_every == 0 or r.step == self.total:
            remaining = (self.total - r.step) * r.step_time_s
            msg = (
                f"step {r.step}/{self.total}  epoch {r.epoch}  loss {r.loss:.4f}  "
                f"grad_norm {r.grad_norm:.3f}  "
                f"lr {r.lr:.2e}  {self._throughput(r)}  MFU {100 * r.mfu:.2f}%  "
                f"step {1000 * r.step_time_s:.0f} ms  ETA {remaining:.0f} s"
            )
            if self._progress is not None:
                self._progress.console.log(msg)
            else:
                log.info(msg)

    def write_event(self, event: Event) -> None:
        log.info(
            "event %s at step %d (%.2f s) %s",
            event.name,
            event.step,
            event.end - event.start,
            event.attrs or "",
        )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
