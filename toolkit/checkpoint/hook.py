"""The training-loop hook of checkpointing: resume at start, interval, final and on-demand
saves, and the committed save that preemption asks for (`commit_now`).

Decisions that change what ranks do travel as votes in the step's own all-reduce
(toolkit.hooks): [a save failed and the run must stop, a save was requested]. The save-now
file is watched by a thread of rank 0, so no step pays for a filesystem call.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from toolkit.checkpoint.checkpointer import Checkpointer, SaveResult
from toolkit.checkpoint.discovery import committed_steps
from toolkit.checkpoint.layout import CONFIG, checkpoints_dir
from toolkit.checkpoint.loading import CheckpointMismatch
from toolkit.checkpoint.manifest import CheckpointCorrupt, CheckpointTooNew
from toolkit.checkpoint.resume import candidates, choose_together, newest_first
from toolkit.checkpoint.state import (
    ConfigRecord,
    changes_meaning,
    changes_schedule,
    config_diff,
    restore_rng,
)
from toolkit.checkpoint.storage import FaultyStorage, LocalStorage, Storage
from toolkit.checkpoint.trust import UnsafeCheckpoint
from toolkit.config.checkpoint import CheckpointConfig
from toolkit.config.fault import FaultConfig
from toolkit.distributed.env import restart_count
from toolkit.errors import (
    EXIT_CHECKPOINT_UNUSABLE,
    EXIT_RESUME_REFUSED,
    EXIT_SAVE_FAILED,
    UserError,
)
from toolkit.events import Event, Sink, StepRecord
from toolkit.hooks import CommitStatus, Hook, Stop, TrainerView

log = logging.getLogger(__name__)

SAVE_NOW_FILE = "save-now"  # touch RUN_DIR/checkpoints/save-now to checkpoint at the next step
SAVE_NOW_POLL_S = 1.0  # how often rank 0's watcher looks for it


def build_storage(cfg: CheckpointConfig, fault: FaultConfig, step: int | None = None) -> Storage:
    """The storage for the save of `step` (None: reading and housekeeping): a FaultyStorage
    where a fault.save_* injection applies to that step, the plain one otherwise."""
    full = fault.save_enospc_after_bytes is not None and (
        step is None or fault.save_enospc_from_step is None or step >= fault.save_enospc_from_step
    )
    stalled = step is not None and fault.save_stall_step == step
    if full or stalled:
        return FaultyStorage(
            fault.save_enospc_after_bytes if full else None,
            fault.save_stall_s if stalled else 0.0,
            cfg.direct_io,
            cfg.cache_headers,
        )
    return LocalStorage(cfg.direct_io, cfg.cache_headers)


class SaveNowWatcher:
    """Rank 0's thread that turns the save-now file into a request (removing the file)."""

    def __init__(self, trigger: Path, poll_s: float = SAVE_NOW_POLL_S):
        self.trigger = trigger
        self.poll_s = poll_s
        self.requested = threading.Event()
        self._stop = threading.Event()
        self._look()  # a file left before the start counts for the first step
        self._thread = threading.Thread(target=self._watch, name="save-now-watcher", daemon=True)
        self._thread.start()

    def _look(self) -> None:
        try:
            if self.trigger.exists():
                self.trigger.unlink(missing_ok=True)
                self.requested.set()
        except OSError as exc:  # a failed look is retried next time
            log.warning("save-now: cannot check %s: %s", self.trigger, exc)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._look()

    def take(self) -> bool:
        """Whether a save was requested since the last call."""
        if self.requested.is_set():
            self.requested.clear()
            return True
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class CheckpointHook(Hook):
    num_votes = 2  # [a failed save must stop the run, a save was requested]

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        config: ConfigRecord,
        sink: Sink,
        fault: FaultConfig | None = None,
    ):
        self.cfg = cfg
        self.root = checkpoints_dir(run_dir)
        self.config = config
        self.sink = sink
        self.fault = fault or FaultConfig()
        self.ckpt: Checkpointer | None = None
        self.storage: Storage = build_storage(cfg, self.fault)
        self.watcher: SaveNowWatcher | None = None
        self._save_failed = False
        self._verify_s = 0.0

    # -- start: resume -------------------------------------------------------------------
    def on_start(self, trainer: TrainerView) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ckpt = Checkpointer(
            self.cfg, self.root, self.storage, self.config.text, self.config.hash, trainer.device
        )
        if trainer.rank == 0:
            log.info("checkpoints in %s", self.root)
            self.watcher = SaveNowWatcher(self.root / SAVE_NOW_FILE)
        path = self._pick_resume_path(trainer.rank, trainer.world_size)
        if path is not None:
            self._resume(trainer, Path(path))

    def _pick_resume_path(self, rank: int, world_size: int) -> str | None:
        """Rank 0 removes torn saves and lists the candidates; all ranks verify them together
        (toolkit.checkpoint.resume) and resume from the same one."""
        t0 = time.perf_counter()
        plan: list[Any] = [None, None, False]  # [candidates, error, the user can act on it]
        if rank == 0:
            try:
                plan[0] = candidates(self.storage, self.root, self.cfg)
            except CheckpointCorrupt as exc:  # e.g. resume_from names nothing committed
                plan[1:] = [str(exc), True]
            except Exception as exc:  # noqa: BLE001 - every rank must learn of it, not hang
                plan[1] = f"{type(exc).__name__}: {exc}"
        dist.broadcast_object_list(plan, src=0)
        if plan[2]:
            raise UserError(f"cannot resume: {plan[1]}", EXIT_CHECKPOINT_UNUSABLE)
        if plan[1] is not None:
            raise RuntimeError(f"cannot resume: {plan[1]}")
        try:
            path = choose_together(plan[0], self.cfg.verify, rank, world_size)
        except (CheckpointCorrupt, CheckpointTooNew) as exc:
            raise UserError(f"cannot resume: {exc}", EXIT_CHECKPOINT_UNUSABLE) from None
        except RuntimeError as exc:  # a rank could not check its share; the message says so
            raise RuntimeError(f"cannot resume: {exc}") from None
        self._verify_s = time.perf_counter() - t0
        return None if path is None else str(path)

    def _resume(self, trainer: TrainerView, path: Path) -> None:
        t0 = time.time()
        try:
            attrs = self._load(trainer, path)
        except UnsafeCheckpoint as exc:  # crafted or foreign: it names the file
            raise UserError(f"cannot resume: {exc}", EXIT_CHECKPOINT_UNUSABLE) from None
        attrs["restart_count"] = restart_count()
        self.sink.write_event(Event("restart", t0, time.time(), trainer.step, trainer.rank, attrs))
        log.info("resumed from %s at step %d", path, trainer.step)

    def restore_finite(self, trainer: TrainerView) -> str | None:
        """Roll back (trainer.on_nonfinite=rollback): the save in flight commits first (it
        holds a finite state: nothing non-finite is saved), then every rank loads the newest
        committed checkpoint that verifies, through the resume path. None: none committed."""
        if self.ckpt is None:
            return None
        self._report(trainer, self.ckpt.wait())
        t0 = time.perf_counter()
        listed: list[Any] = [None]
        if trainer.rank == 0:
            listed[0] = newest_first(self.storage, self.root, fallback=True)
        dist.broadcast_object_list(listed, src=0)
        path = choose_together(listed[0], self.cfg.verify, trainer.rank, trainer.world_size)
        self._verify_s = time.perf_counter() - t0
        if path is None:
            return None
        self._load(trainer, path)
        return str(path)

    def _load(self, trainer: TrainerView, path: Path) -> dict[str, Any]:
        """Load `path` into the trainer (refused when it does not fit the model or changes
        what is trained); what happened, as a restart event's attributes."""
        assert self.ckpt is not None
        t0 = time.time()
        try:
            self.ckpt.check_fits(path, trainer.model, trainer.optimizer)
        except CheckpointMismatch as exc:
            shown = "; ".join(exc.problems[:3]) + ("; …" if len(exc.problems) > 3 else "")
            log.info("%s", exc)  # every mismatched key, in the rank's log
            raise UserError(
                f"cannot resume from {path}: it does not fit this model ({len(exc.problems)} "
                f"mismatched keys: {shown}); written with another model config? Resume with "
                "the checkpoint's model settings or start a new hydra.run.dir",
                EXIT_RESUME_REFUSED,
            ) from None
        diff = self._config_changes(path)
        meaning = [d for d in diff if changes_meaning(d)]
        if meaning and not self.cfg.allow_config_change:
            raise UserError(
                f"cannot resume from {path}: the config changes what is trained "
                f"({'; '.join(meaning[:10])}{'; …' if len(meaning) > 10 else ''}); resume with "
                "the checkpoint's values, start a new hydra.run.dir, or set "
                "checkpoint.allow_config_change=true",
                EXIT_RESUME_REFUSED,
            )
        schedule = [d for d in diff if changes_schedule(d)]
        if diff and trainer.rank == 0:
            log.warning("config differs from the checkpoint's: %s", "; ".join(diff[:20]))
        if schedule and trainer.rank == 0:
            log.warning(
                "the learning-rate schedule changes from this step: %s", "; ".join(schedule)
            )
        state, rng = self.ckpt.load(path, trainer.model, trainer.optimizer)
        trainer.load_state_dict(state)
        if rng is not None:
            restore_rng(rng)
        else:
            log.warning(
                "checkpoint has no RNG state for rank %d (saved by %d ranks)",
                trainer.rank,
                state["world_size"],
            )
        return {
            "checkpoint": str(path),
            "verify_s": self._verify_s,  # discovery + this rank's share of the checks
            "load_s": time.time() - t0,
            "saved_world_size": int(state["world_size"]),
            "world_size": trainer.world_size,
            "config_changed": diff,  # every change, each allowed (else refused)
            # checkpoint.allow_config_change, and the changes that needed it
            "config_change_allowed": self.cfg.allow_config_change,
            "changes_needing_permission": meaning,
            # in effect from this step: the schedule keeps only its position
            "schedule_changed": schedule,
            "global_batch_size": trainer.state_dict()["global_batch_size"],
        }

    def _config_changes(self, path: Path) -> list[str]:
        """'key: old -> new' for every key of the resolved config that differs from the
        checkpoint's (the run dir and the checkpoint group itself left out)."""
        saved_path = path / CONFIG
        saved = json.loads(saved_path.read_text()) if saved_path.is_file() else {}
        return [
            d
            for d in config_diff(saved, self.config.as_dict())
            if not d.startswith(("checkpoint.", "run_dir:"))
        ]

    # -- every step ----------------------------------------------------------------------
    def before_optimizer_step(self, trainer: TrainerView) -> None:
        """An overlapped checkpoint copy must finish before the optimizer changes the state."""
        if self.ckpt is not None:
            self.ckpt.wait_staged()

    def votes(self, trainer: TrainerView) -> list[float]:
        assert self.ckpt is not None
        self._report(trainer, self.ckpt.poll())
        requested = self.watcher is not None and self.watcher.take()
        stop_on_error = self._save_failed and self.cfg.on_save_error == "stop"
        return [float(stop_on_error), float(requested)]

    def after_step(
        self, trainer: TrainerView, record: StepRecord, votes: list[float]
    ) -> Stop | None:
        failed, requested = (v > 0 for v in votes)
        if failed:
            log.error("stopping: a checkpoint could not be written (checkpoint.on_save_error=stop)")
            return Stop("checkpoint failed", exit_code=EXIT_SAVE_FAILED, save=False)
        step = trainer.step
        interval = self.cfg.interval_steps > 0 and step % self.cfg.interval_steps == 0
        if requested or interval:
            self._save(trainer, blocking=False)
        return None

    def on_stop(self, trainer: TrainerView, stop: Stop) -> Stop | None:
        """The final checkpoint (completed, time budget, target loss, preemption)."""
        if stop.save and self.cfg.save_final:
            self._save(trainer, blocking=False)
        return None

    def _save(self, trainer: TrainerView, blocking: bool) -> None:
        assert self.ckpt is not None
        if self.fault.save_enospc_after_bytes is not None or self.fault.save_stall_step:
            self.ckpt.storage = build_storage(self.cfg, self.fault, trainer.step)  # injected
        state = {**trainer.state_dict(), "config_hash": self.config.hash}
        self.ckpt.save(trainer.step, trainer.model, trainer.optimizer, state, blocking=blocking)
        if blocking:
            self._report(trainer, self.ckpt.poll())

    def commit_now(self, trainer: TrainerView, retry: bool = False) -> CommitStatus:
        """Save this step (again, with retry) and wait for its commit; every rank calls it
        and gets rank 0's view (rank 0 commits)."""
        assert self.ckpt is not None
        if retry:
            self.ckpt.last_step = None  # the step's first try failed: write it again
        self._save(trainer, blocking=True)
        status: list[Any] = [None]
        if trainer.rank == 0:
            steps = committed_steps(self.storage, self.root)
            status[0] = (trainer.step in steps, max(steps) if steps else None)
        if trainer.world_size > 1:
            dist.broadcast_object_list(status, src=0)
        committed, latest = status[0]
        return CommitStatus(step_committed=bool(committed), latest_step=latest)

    def _report(self, trainer: TrainerView, results: list[SaveResult]) -> None:
        for r in results:
            attrs = {
                "path": str(r.path),
                "stall_s": r.stall_s,
                "wait_previous_s": r.wait_previous_s,
                "staging_s": r.staging_s,
                "write_s": r.write_s,
                "checksum_s": r.checksum_s,
                "commit_s": r.commit_s,
                "size_bytes": r.size_bytes,
                "async": self.cfg.async_save,
                "writer_priority": getattr(r.writer, "thread_priority", None),
                "direct_io": getattr(r.writer, "direct_io", None),
            }
            if r.error is not None:
                self._save_failed = True
                attrs["error"] = r.error
                if trainer.rank == 0:
                    log.error(
                        "checkpoint step %d failed: %s; the previous committed checkpoint is intact%s",
                        r.step,
                        r.error,
                        "" if self.cfg.on_save_error == "stop" else "; training goes on",
                    )
            self.sink.write_event(
                Event(
                    "checkpoint" if r.error is None else "checkpoint_failed",
                    r.start,
                    r.end,
                    r.step,
                    trainer.rank,
                    attrs,
                )
            )

    # -- end -----------------------------------------------------------------------------
    def on_end(self, trainer: TrainerView) -> None:
        if self.watcher is not None:
            self.watcher.close()
        if self.ckpt is not None:
            self.ckpt.close()  # the save in flight commits before the process ends
            self._report(trainer, self.ckpt.poll())
