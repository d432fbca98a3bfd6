"""Checkpointing (owned by the checkpoint component; see toolkit/checkpoint/)."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.config.errors import not_one_of


@dataclass
class CheckpointConfig:
    """Sharded DCP checkpoints in RUN_DIR/checkpoints/step-<N>, committed atomically."""

    enabled: bool = False
    interval_steps: int = 0  # 0: only on demand, at the last step and at preemption
    async_save: bool = True  # stage to CPU, write in the background; False: blocking DCP save
    # Copy the state into CPU memory while the next step's forward/backward runs; the
    # optimizer step waits for the copy. False: the copy blocks the training thread.
    overlap_staging: bool = True
    save_final: bool = True  # also checkpoint after the last training step
    keep_last: int = 2  # committed checkpoints kept (the newest is never deleted)
    keep_every: int = 0  # also keep every M-th step forever; 0: none
    resume: bool = True  # resume from the latest committed checkpoint in the run dir
    resume_from: str | None = None  # an explicit checkpoint directory (wins over resume)
    # Resume even when the config changes what is trained (model, optim, data, seed,
    # precision, global batch): the changed keys are listed and recorded either way.
    allow_config_change: bool = False
    verify: bool = True  # check every file's size and checksum against the manifest before loading
    on_corrupt: str = "fallback"  # fallback: warn and use the previous one | fail: stop
    on_save_error: str = "continue"  # continue: warn and train on | stop: stop cleanly
    max_restarts: int = 10  # Slurm requeues allowed (SLURM_RESTART_COUNT); then stop for good
    requeue: bool = True  # on Slurm, requeue the job after the preemption checkpoint
    # Scheduling priority of the threads that write, checksum and delete checkpoints:
    # idle (SCHED_IDLE: only CPU time training does not want) | low (nice 19) | normal.
    writer_priority: str = "idle"
    # Write shards with O_DIRECT, around the page cache (much less CPU taken from training;
    # see toolkit.checkpoint.directio); filesystems that refuse it get ordinary writes.
    direct_io: bool = True
    # Reuse the previous save's DCP plan while the state's structure is unchanged (less
    # Python on the save's thread: see toolkit.checkpoint.planning); false: plan every save.
    cache_plans: bool = True
    # Write each tensor as torch.save would, from its archive's header and trailer learnt
    # once per layout, instead of pickling it every save (the same bytes, less Python on the
    # save's thread: see toolkit.checkpoint.serialization); false: torch.save per tensor.
    cache_headers: bool = True

    ON_CORRUPT = ("fallback", "fail")
    ON_SAVE_ERROR = ("continue", "stop")
    WRITER_PRIORITY = ("idle", "low", "normal")  # see toolkit.checkpoint.priority


def problems(cfg: CheckpointConfig) -> list[str]:
    """Problems with the checkpoint group, one line each (field, value, what is allowed)."""
    p = []
    if cfg.interval_steps < 0:
        p.append(f"checkpoint.interval_steps={cfg.interval_steps}: must be >= 0 (0: no interval)")
    if cfg.keep_last < 1:
        p.append(f"checkpoint.keep_last={cfg.keep_last}: must be >= 1 (the newest is always kept)")
    if cfg.keep_every < 0:
        p.append(f"checkpoint.keep_every={cfg.keep_every}: must be >= 0 (0: none kept forever)")
    p += not_one_of(
        "checkpoint",
        cfg,
        {
            "on_corrupt": CheckpointConfig.ON_CORRUPT,
            "on_save_error": CheckpointConfig.ON_SAVE_ERROR,
            "writer_priority": CheckpointConfig.WRITER_PRIORITY,
        },
    )
    if cfg.max_restarts < 0:
        p.append(f"checkpoint.max_restarts={cfg.max_restarts}: must be >= 0")
    return p
