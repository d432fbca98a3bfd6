"""Which checkpoint a starting job resumes from, verified by all its ranks together.

Rank 0 removes torn `.tmp` saves and lists the candidates in the order they are tried: the
run's own committed checkpoints, newest first (a requeued or relaunched job continues its
run), then `checkpoint.resume_from` (a checkpoint, or a run directory: its newest). Then every
rank checks the sizes and checksums of its share of the files (rank 0 also lists the
directory and reads DCP's .metadata), and the ranks agree through one gather per candidate: a
rank reads and stats about 1/world of the checkpoint, instead of rank 0 reading all of it
while the others wait (or every rank stating every file: world x (2 world + 3) metadata
operations on the shared file system, 268 million at 8,192 ranks; see docs/fault.md). A corrupt candidate
is skipped with a warning where fallback is allowed (`checkpoint.on_corrupt=fallback`, the
run's own checkpoints only), and stops the job otherwise. A checkpoint written by a newer
torch than this job's stops the job before any rank loads it, fallback or not: an older
checkpoint would silently lose progress, and it was most likely written by that torch too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from toolkit.checkpoint.discovery import committed_steps, remove_torn
from toolkit.checkpoint.layout import committed_path
from toolkit.checkpoint.manifest import (
    CheckpointCorrupt,
    CheckpointTooNew,
    check_metadata,
    verify_checksums,
    verify_sizes,
)
from toolkit.checkpoint.storage import Storage
from toolkit.config.checkpoint import CheckpointConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    path: Path
    fallback: bool  # when corrupt: try the next candidate (True) or stop the job
    hint: str = ""  # appended to the error when corrupt and no fallback


_FAIL_HINT = "; checkpoint.on_corrupt=fail (use fallback to resume from an older one)"


def newest_first(storage: Storage, root: Path, fallback: bool) -> list[Candidate]:
    """The committed checkpoints under `root`, newest first, as candidates."""
    hint = "" if fallback else _FAIL_HINT
    return [
        Candidate(committed_path(root, step), fallback, hint)
        for step in reversed(committed_steps(storage, root))
    ]


def candidates(storage: Storage, root: Path, cfg: CheckpointConfig) -> list[Candidate]:
    """The checkpoints to try, in order (rank 0, at start, before any save)."""
    remove_torn(storage, root)
    if not (cfg.resume or cfg.resume_from):
        return []
    own = newest_first(storage, root, fallback=cfg.on_corrupt == "fallback")
    if own and cfg.resume_from:
        log.info("run dir has committed checkpoints; ignoring checkpoint.resume_from")
    if not cfg.resume_from:
        return own
    explicit = Path(cfg.resume_from).expanduser().resolve()
    if not explicit.is_dir():
        raise CheckpointCorrupt(
            f"checkpoint.resume_from={explicit}: not a directory; point it at a checkpoint "
            "(RUN_DIR/checkpoints/step-N) or a run directory"
        )
    if (explicit / "checkpoints").is_dir():  # a run directory: its newest
        steps = committed_steps(storage, explicit / "checkpoints")
        if not steps:
            raise CheckpointCorrupt(f"checkpoint.resume_from={explicit}: no committed checkpoint")
        explicit = committed_path(explicit / "checkpoints", steps[-1])
    return [*own, Candidate(explicit, False)]


def latest_valid(
    storage: Storage, root: Path, *, checksums: bool = True, fallback: bool = True
) -> Path | None:
    """The newest committed checkpoint under `root` that verifies, checked by this process
    alone (no process group: post-run tools). A corrupt one is skipped with a warning naming
    the bad file (fallback) or raises CheckpointCorrupt (no fallback)."""
    return choose_together(newest_first(storage, root, fallback), checksums, rank=0, world_size=1)


def choose_together(
    options: list[Candidate], checksums: bool, rank: int, world_size: int, group: Any = None
) -> Path | None:
    """The first candidate that every rank found intact (call on all ranks with the same
    list). Raises CheckpointCorrupt on all ranks when one without fallback is corrupt,
    CheckpointTooNew when one was written by a newer torch, and RuntimeError when a rank
    could not check its share for another reason."""
    for option in options:
        problem = _check_share(option.path, checksums, rank, world_size)
        problems: list[Any] = [problem] * world_size
        if world_size > 1:
            dist.all_gather_object(problems, problem, group=group)
        too_new = [p[1] for p in problems if p is not None and p[0] == "too_new"]
        if too_new:
            raise CheckpointTooNew(too_new[0])
        errors = [p[1] for p in problems if p is not None and p[0] == "error"]
        if errors:
            raise RuntimeError(f"cannot check checkpoint {option.path}: {errors[0]}")
        corrupt = sorted({p[1] for p in problems if p is not None and p[0] == "corrupt"})
        if not corrupt:
            return option.path
        if not option.fallback:
            raise CheckpointCorrupt(corrupt[0] + option.hint)
        if rank == 0:
            log.warning(
                "skipping corrupt checkpoint: %s; falling back to an older one", "; ".join(corrupt)
            )
    return None


def _check_share(path: Path, checksums: bool, rank: int, world_size: int) -> tuple[str, str] | None:
    """None if intact as far as this rank checked: the sizes and checksums of every
    world_size-th file from this rank's index on; rank 0 also lists the directory and reads
    DCP's .metadata (the ranks gather their verdicts, so one rank's check is everyone's)."""
    try:
        manifest = verify_sizes(path, share=(rank, world_size))
        if checksums:
            verify_checksums(path, manifest, sorted(manifest.files)[rank::world_size])
        if rank == 0:
            check_metadata(path, manifest)
    except CheckpointCorrupt as exc:
        return ("corrupt", str(exc))
    except CheckpointTooNew as exc:
        return ("too_new", str(exc))
    except Exception as exc:  # noqa: BLE001 - every rank must reach the gather
        return ("error", f"rank {rank}: {type(exc).__name__}: {exc}")
    return None
