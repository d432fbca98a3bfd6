"""An ensemble's members as runs of their own: which are alive, each one's losses and
records, and its files in the run dir (docs/ensembles.md):

    RUN/members/<name>/member.json        its name, index, seed and settings, and the
                                          data order's seed (data_seed) every member saw
    RUN/members/<name>/metrics/rank<k>.jsonl  its StepRecords (the run's schema)
    RUN/members/<name>/summary.json       its summary (the run's schema, plus member fields)

The run's own metrics keep the ensemble's record (loss: the mean over live members). A
member whose loss or grad norm is non-finite at step N is dropped there: its update of that
step is not applied, its lr is 0 and its gradient masked from then on (StackedAdamW), its
loss no longer counts, and its summary says "dropped_at_step": N. Trackers get each step's
member values as one `members` event (event/members/<name>/loss, .../grad_norm, .../lr).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from toolkit.distributed.env import restart_count
from toolkit.events import Event, JsonlSink, Sink, StepRecord, json_safe
from toolkit.files import write_private
from toolkit.train.ensemble import Member

log = logging.getLogger(__name__)


def member_dir(run_dir: Path, name: str) -> Path:
    return run_dir / "members" / name


class Members:
    """The members' state in one rank: alive mask, dropped steps, last values, and their
    metrics files (every rank writes its own, as the run's JsonlSink does)."""

    def __init__(self, members: list[Member], run_dir: Path, rank: int, data_seed: int):
        self.members = members
        self.run_dir = run_dir
        self.rank = rank
        self.alive = torch.ones(len(members), dtype=torch.bool)
        self.dropped_at: list[int | None] = [None] * len(members)
        self.losses: list[list[float]] = [[] for _ in members]
        self.last_grad_norms = [0.0] * len(members)
        self.last_lrs = [0.0] * len(members)
        self.val_losses: list[float | None] = [None] * len(members)
        self.trackers: Sink | None = None  # the run's tracker sinks (set by task=train)
        restarts = restart_count()  # records carry their attempt, as the run's do
        self._sinks = [
            JsonlSink(member_dir(run_dir, m.name) / "metrics", rank, restarts) for m in members
        ]
        if rank == 0:
            for m in members:
                write_private(
                    member_dir(run_dir, m.name) / "member.json",
                    json.dumps({**m.as_dict(), "data_seed": data_seed}, indent=2),
                )

    @property
    def num_alive(self) -> int:
        return int(self.alive.sum())

    def observe(
        self, losses: list[float], grad_norms: list[float], bad: list[bool], step: int
    ) -> None:
        """Step `step`'s (1-based) summed member values; drop the members that went
        non-finite (before the optimizer step, which then leaves them out)."""
        for i, m in enumerate(self.members):
            if not self.alive[i]:
                continue
            if bad[i]:
                self.alive[i] = False
                self.dropped_at[i] = step
                log.warning(
                    "ensemble: member %s dropped at step %d: non-finite loss (%.4g) or grad "
                    "norm (%.4g); the other %d go on",
                    m.name,
                    step,
                    losses[i],
                    grad_norms[i],
                    self.num_alive,
                )
                continue
            self.losses[i].append(losses[i])
            self.last_grad_norms[i] = grad_norms[i]

    def live_mean(self, values: list[float]) -> float:
        live = [v for v, ok in zip(values, self.alive.tolist(), strict=True) if ok]
        return sum(live) / len(live) if live else math.nan

    def write_step(self, record: StepRecord, lrs: list[float]) -> None:
        """Each live member's record (the ensemble's, with its own loss, grad norm and lr)
        to its metrics file; their values to the trackers as one `members` event."""
        attrs: dict[str, float] = {}
        for i, m in enumerate(self.members):
            if not self.alive[i] or not self.losses[i]:
                continue
            loss, norm = self.losses[i][-1], self.last_grad_norms[i]
            self.last_lrs[i] = lrs[i]
            member_record = dataclasses.replace(record, loss=loss, grad_norm=norm, lr=lrs[i])
            self._sinks[i].write_step(member_record)
            attrs |= {f"{m.name}/loss": loss, f"{m.name}/grad_norm": norm, f"{m.name}/lr": lrs[i]}
        if self.trackers is not None:
            now = time.time()
            self.trackers.write_event(Event("members", now, now, record.step, self.rank, attrs))

    def write_eval(self, step: int, losses: list[float]) -> None:
        now = time.time()
        for i in range(len(self.members)):
            if not self.alive[i]:
                continue
            self.val_losses[i] = losses[i]
            event = Event("eval", now, now, step, self.rank, {"val_loss": losses[i]})
            self._sinks[i].write_event(event)

    def state_dict(self) -> dict[str, Any]:
        return {"dropped_at": list(self.dropped_at)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dropped_at = [None if s is None else int(s) for s in state["dropped_at"]]
        for i, dropped in enumerate(self.dropped_at):
            self.alive[i] = dropped is None

    def write_summaries(self, summary: dict[str, Any]) -> None:
        """Each member's summary.json: the run's, with the member's own losses (rank 0)."""
        for i, m in enumerate(self.members):
            own = dict(summary)
            losses = self.losses[i]
            own.update(
                member=m.name,
                member_index=m.index,
                seed=m.seed,
                first_loss=losses[0] if losses else None,
                final_loss=losses[-1] if losses else None,
                val_loss=self.val_losses[i],
                dropped_at_step=self.dropped_at[i],
                ensemble=len(self.members),
                run_dir=str(member_dir(self.run_dir, m.name)),
            )
            path = member_dir(self.run_dir, m.name) / "summary.json"
            write_private(path, json.dumps(json_safe(own), indent=2))

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
