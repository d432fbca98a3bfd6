"""At the start of a requeued attempt (rank 0, before training): the nodes left out after the
previous attempt become `node_excluded` events, and a NODE_FAIL nobody handled (a detached
job: no launcher was following it) is found and recorded.

Slurm takes ExcNodeList only from a pending job, so what is found here cannot change this
attempt's nodes: it goes into RUN_DIR/excluded_nodes.json, which every later requeue by the
toolkit merges into the job's exclude list.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from toolkit.distributed.env import restart_count
from toolkit.events import Event, Sink
from toolkit.executors import badnodes
from toolkit.executors.exclusion import hostnames
from toolkit.executors.requeue import JobShape
from toolkit.executors.slurm_exclude import plan
from toolkit.hooks import Hook, TrainerView

log = logging.getLogger(__name__)

NODE_EXCLUDED = "node_excluded"


class ExclusionEvents(Hook):
    def __init__(self, run_dir: Path, job_id: str, shape: JobShape, sink: Sink):
        self.run_dir, self.job_id, self.shape, self.sink = run_dir, job_id, shape, sink

    def on_start(self, trainer: TrainerView) -> None:
        attempt = restart_count()
        if trainer.rank != 0 or attempt == 0:
            return
        try:
            self._previous_attempt(trainer, attempt)
        except Exception as exc:  # noqa: BLE001 - bookkeeping must never stop training
            log.warning("could not review attempt %d's nodes: %s", attempt - 1, exc)

    def _previous_attempt(self, trainer: TrainerView, attempt: int) -> None:
        previous = attempt - 1
        if not any(e.get("attempt") == previous for e in badnodes.excluded(self.run_dir)):
            decision = plan(self.run_dir, self.job_id, previous, self.shape)
            if decision.added:
                badnodes.record(self.run_dir, decision, self.job_id)
                log.warning(
                    "job %s attempt %d: %s (from the next requeue on: Slurm changes the "
                    "exclude list of pending jobs only)",
                    self.job_id,
                    previous,
                    decision.message,
                )
            elif not decision.schedulable or decision.ignored:
                log.warning("job %s attempt %d: %s", self.job_id, previous, decision.message)
        here = hostnames(os.environ.get("SLURM_JOB_NODELIST"))
        now = time.time()
        for entry in badnodes.excluded(self.run_dir):
            if entry.get("attempt") != previous:
                continue
            attrs = {
                "node": entry.get("node"),
                "reason": entry.get("reason"),
                "source": entry.get("source"),
                "failed_attempt": previous,
                "decided_at": entry.get("time"),
                "nodes_now": here,
            }
            self.sink.write_event(Event(NODE_EXCLUDED, now, now, trainer.step, 0, attrs))
            if entry.get("node") in here:
                log.warning("attempt %d runs on excluded node %s", attempt, entry.get("node"))
