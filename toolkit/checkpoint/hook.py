"""The training-loop hook: resume at start, interval/final/on-demand saves, preemption.

Every decision that changes what ranks do (stop, save now) is agreed at a step boundary with
one all_reduce MAX over [signal received, save failed and must stop, save requested].
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from toolkit.checkpoint.checkpointer import Checkpointer, SaveResult
from toolkit.checkpoint.layout import CONFIG, checkpoints_dir
from toolkit.checkpoint.manifest import CheckpointCorrupt
from toolkit.checkpoint.preemption import (
    EXIT_PREEMPTED,
    EXIT_SAVE_FAILED,
    SignalFlag,
    classify,
    job_end_time,
    requeue,
    restart_count,
    signal_number,
)
from toolkit.checkpoint.resume import candidates, choose_together
from toolkit.checkpoint.state import config_diff, config_hash, restore_rng
from toolkit.checkpoint.storage import FaultyStorage, LocalStorage, Storage
from toolkit.config.checkpoint import CheckpointConfig
from toolkit.train.metrics import Event, Sink

log = logging.getLogger(__name__)

SAVE_NOW_FILE = "save-now"  # touch RUN_DIR/checkpoints/save-now to checkpoint at the next step


def build_storage(cfg: CheckpointConfig, step_stalled: bool = False) -> Storage:
    if cfg.fault_enospc_after_bytes is not None or step_stalled:
        return FaultyStorage(
            cfg.fault_enospc_after_bytes,
            cfg.fault_stall_s if step_stalled else 0.0,
            cfg.direct_io,
            cfg.cache_headers,
        )
    return LocalStorage(cfg.direct_io, cfg.cache_headers)


class CheckpointHook:
    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        config: dict[str, Any],
        sink: Sink,
        *,
        signal_name: str = "USR2",
        signal_lead_s: float = 120.0,
        slurm_job_id: str | None = None,
    ):
        self.cfg = cfg
        self.root = checkpoints_dir(run_dir)
        self.config = config
        self.config_hash = config_hash(config)
        self.sink = sink
        self.signal_lead_s = signal_lead_s
        self.slurm_job_id = slurm_job_id
        self._signals = sorted({signal_number(signal_name), int(signal.SIGTERM)})
        self.flag: SignalFlag | None = None
        self.ckpt: Checkpointer | None = None
        self.storage: Storage = build_storage(cfg)
        self._save_failed = False
        self._requested = False
        self._stop_reason: str | None = None
        self._signal_name = "none"
        self._verify_s = 0.0

    def request_save(self) -> None:
        """Checkpoint at the next step boundary (call on any rank)."""
        self._requested = True

    # -- start: resume -------------------------------------------------------------------
    def on_start(self, trainer: Any) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ckpt = Checkpointer(
            self.cfg, self.root, self.storage, self.config, self.config_hash, trainer.device
        )
        self.flag = SignalFlag(self._signals)
        if trainer.rank == 0:
            log.info(
                "checkpoints in %s; preemption signals armed: %s",
                self.root,
                ", ".join(signal.Signals(s).name for s in self._signals),
            )
        path = self._pick_resume_path(trainer.rank, trainer.world_size)
        if path is not None:
            self._resume(trainer, Path(path))

    def _pick_resume_path(self, rank: int, world_size: int) -> str | None:
        """Rank 0 removes torn saves and lists the candidates; all ranks verify them together
        (toolkit.checkpoint.resume) and resume from the same one."""
        t0 = time.perf_counter()
        plan: list[Any] = [None, None]  # [candidates, error]
        if rank == 0:
            try:
                plan[0] = candidates(self.storage, self.root, self.cfg)
            except Exception as exc:  # noqa: BLE001 - every rank must learn of it, not hang
                plan[1] = f"{type(exc).__name__}: {exc}"
        dist.broadcast_object_list(plan, src=0)
        if plan[1] is not None:
            raise RuntimeError(f"cannot resume: {plan[1]}")
        try:
            path = choose_together(plan[0], self.cfg.verify, rank, world_size)
        except CheckpointCorrupt as exc:
            raise RuntimeError(f"cannot resume: CheckpointCorrupt: {exc}") from None
        except RuntimeError as exc:  # a rank could not check its share; the message says so
            raise RuntimeError(f"cannot resume: {exc}") from None
        self._verify_s = time.perf_counter() - t0
        return None if path is None else str(path)

    def _resume(self, trainer: Any, path: Path) -> None:
        assert self.ckpt is not None
        t0 = time.time()
        saved_config = json.loads((path / CONFIG).read_text()) if (path / CONFIG).is_file() else {}
        diff = [
            d
            for d in config_diff(saved_config, self.config)
            if not d.startswith(("checkpoint.", "run_dir:"))
        ]
        if diff and trainer.rank == 0:
            log.warning("config differs from the checkpoint's: %s", "; ".join(diff[:20]))
        state, rng = self.ckpt.load(path, trainer.model, trainer.optimizer)
        trainer.state.step = int(state["step"])
        trainer.state.tokens_seen = int(state["tokens_seen"])
        trainer.scheduler.load_state_dict(state["scheduler"])
        trainer.loader.load_state_dict(state["loader"])
        if rng is not None:
            restore_rng(rng)
        else:
            log.warning(
                "checkpoint has no RNG state for rank %d (saved by %d ranks)",
                trainer.rank,
                state["world_size"],
            )
        self.sink.write_event(
            Event(
                "restart",
                t0,
                time.time(),
                trainer.state.step,
                trainer.rank,
                {
                    "checkpoint": str(path),
                    "verify_s": self._verify_s,  # discovery + this rank's share of the checks
                    "load_s": time.time() - t0,
                    "restart_count": restart_count(),
                    "saved_world_size": int(state["world_size"]),
                    "world_size": trainer.world_size,
                    "config_changed": diff[:20],
                },
            )
        )
        log.info("resumed from %s at step %d", path, trainer.state.step)

    # -- every step ----------------------------------------------------------------------
    def before_optimizer_step(self, trainer: Any) -> None:
        """An overlapped checkpoint copy must finish before the optimizer changes the state."""
        if self.ckpt is not None:
            self.ckpt.wait_staged()

    def after_step(self, trainer: Any, record: Any) -> bool:
        assert self.ckpt is not None and self.flag is not None
        self._report(trainer, self.ckpt.poll())
        requested = self._requested or self._save_now_file(trainer.rank)
        self._requested = False
        stop_on_error = self._save_failed and self.cfg.on_save_error == "stop"
        local = torch.tensor(
            [float(self.flag.signum or 0), float(stop_on_error), float(requested)],
            device=trainer.device,
        )
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        signum, failed, requested = (int(v) for v in local.tolist())
        self._signal_name = signal.Signals(signum).name if signum else "none"
        step = trainer.state.step
        if signum:  # any rank got a signal: every rank checkpoints and stops here
            return self._preempted(trainer)
        if failed:
            log.error("stopping: a checkpoint could not be written (checkpoint.on_save_error=stop)")
            trainer.state.extra["exit_code"] = EXIT_SAVE_FAILED
            self._stop_reason = "checkpoint failed"
            return True
        last = step >= trainer.cfg.steps and self.cfg.save_final
        interval = self.cfg.interval_steps > 0 and step % self.cfg.interval_steps == 0
        if requested or interval or last:
            self._save(trainer, blocking=False)
        return False

    def _save_now_file(self, rank: int) -> bool:
        trigger = self.root / SAVE_NOW_FILE
        if rank != 0 or not trigger.exists():
            return False
        trigger.unlink(missing_ok=True)
        return True

    def _save(self, trainer: Any, blocking: bool) -> None:
        assert self.ckpt is not None
        stalled = self.cfg.fault_stall_step == trainer.state.step
        if stalled or self.cfg.fault_enospc_after_bytes is not None:
            self.ckpt.storage = build_storage(self.cfg, stalled)  # fault injection (tests)
        state = {
            "step": trainer.state.step,
            "tokens_seen": trainer.state.tokens_seen,
            "scheduler": trainer.scheduler.state_dict(),
            "loader": trainer.loader.state_dict(),
            "world_size": trainer.world_size,
            "config_hash": self.config_hash,
            "extra": trainer.state.extra,
        }
        self.ckpt.save(
            trainer.state.step, trainer.model, trainer.optimizer, state, blocking=blocking
        )
        if blocking:
            self._report(trainer, self.ckpt.poll())

    def _report(self, trainer: Any, results: list[SaveResult]) -> None:
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

    # -- preemption ----------------------------------------------------------------------
    def _preempted(self, trainer: Any) -> bool:
        assert self.ckpt is not None and self.flag is not None
        t0 = time.time()
        step = trainer.state.step
        self._save(trainer, blocking=True)  # waits for any save in flight, then this one
        reason, requeued = "signal", False
        job_id = self.slurm_job_id
        if job_id is not None:
            reason = (
                classify(job_end_time(job_id), time.time(), self.signal_lead_s)
                if trainer.rank == 0
                else "slurm"
            )
        attrs: dict[str, Any] = {
            "signal": self._signal_name,
            "reason": reason,
            "slurm_job_id": job_id,
        }
        if job_id is not None and trainer.rank == 0:
            restarts = restart_count()
            attrs["restart_count"] = restarts
            if not self.cfg.requeue:
                log.warning("checkpoint.requeue=false: not requeueing job %s", job_id)
            elif restarts >= self.cfg.max_restarts:
                log.error(
                    "job %s restarted %d times (checkpoint.max_restarts=%d): not requeueing",
                    job_id,
                    restarts,
                    self.cfg.max_restarts,
                )
            else:
                requeued = requeue(job_id)
                log.warning(
                    "%s (%s) at step %d: checkpointed; job %s requeued=%s",
                    reason,
                    self._signal_name,
                    step,
                    job_id,
                    requeued,
                )
        attrs["requeued"] = requeued
        self.sink.write_event(Event("preemption", t0, time.time(), step, trainer.rank, attrs))
        self._stop_reason = f"{reason} ({self._signal_name})"
        if job_id is None:
            trainer.state.extra["exit_code"] = EXIT_PREEMPTED
            if trainer.rank == 0:
                log.warning(
                    "received %s: checkpointed step %d; exiting with code %d. Relaunch with the "
                    "same hydra.run.dir to resume.",
                    self._signal_name,
                    step,
                    EXIT_PREEMPTED,
                )
        return True

    # -- end -----------------------------------------------------------------------------
    def on_end(self, trainer: Any) -> None:
        if self.ckpt is not None:
            self.ckpt.close()  # the save in flight commits before the process ends
            self._report(trainer, self.ckpt.poll())
        if self.flag is not None:
            self.flag.close()
        if self._stop_reason is not None:
            trainer.stop_reason = self._stop_reason  # the loop only knows "stopped by hook"


def slurm_job_id(env_source: str) -> str | None:
    """The job to requeue: SLURM_JOB_ID when the ranks were started by Slurm (srun), not
    when a local job merely runs inside an allocation."""
    return (os.environ.get("SLURM_JOB_ID") or None) if env_source == "slurm" else None
