"""Sharded DCP saves (async or blocking) with atomic commit, and loads with resharding
(toolkit.checkpoint.loading).

A save: every rank writes its RNG state (JSON) and its shards into `step-<N>.tmp/`; rank 0
also writes the trainer state and config (JSON). With `async_save`, the training thread
waits only for the previous save (at most one in flight) and for the copy of the state into
CPU memory (pinned on GPU); with `overlap_staging` the copy runs in a staging thread during
the next step's forward/backward, without holding the GIL (toolkit.checkpoint.staging), and
the trainer waits for it before the optimizer step (`wait_staged`), the first moment the
saved tensors change. DCP writes in a background thread over a gloo group of its own,
so its collectives never interleave with training's; with `cache_plans` a save of
a state whose structure is unchanged reuses the previous save's plan
(toolkit.checkpoint.planning). A commit worker per rank waits for the
write (the writer checksums each shard as it writes it, around the page cache where the
filesystem allows: see toolkit.checkpoint.directio); rank 0 gathers the checksums, writes the
manifest (sizes, checksums), fsyncs the directories inside (their entries must be durable
before the commit), renames the directory to `step-<N>`, and hands retention to the purge
worker. DCP's finish step gathers every rank's write result on rank 0 before the
future completes, so rank 0 commits only after all ranks finished writing. The background
threads run at `checkpoint.writer_priority` (see toolkit.checkpoint.priority).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from toolkit.checkpoint.discovery import committed_steps
from toolkit.checkpoint.layout import (
    CONFIG,
    MANIFEST,
    TRAIN_STATE,
    committed_path,
    rng_file,
    tmp_path,
)
from toolkit.checkpoint.loading import check_fits, load_into, read_train_state
from toolkit.checkpoint.manifest import FileEntry, build_manifest, describe_files
from toolkit.checkpoint.planning import PlanCache
from toolkit.checkpoint.priority import lower_this_thread
from toolkit.checkpoint.retention import Purger, steps_to_delete
from toolkit.checkpoint.staging import build_stager
from toolkit.checkpoint.state import capture_rng, to_json_bytes
from toolkit.checkpoint.storage import Storage
from toolkit.config.checkpoint import CheckpointConfig

log = logging.getLogger(__name__)


@dataclass
class SaveResult:
    """One save as seen by this rank; `error` is None when it was written (and committed)."""

    step: int
    path: Path  # the committed directory (or the .tmp one when it failed)
    start: float  # time.time() when save() was called
    stall_s: float = 0.0  # training thread blocked: waiting for the previous save + staging
    wait_previous_s: float = 0.0
    staging_s: float = 0.0  # state dict + copy to CPU memory (+ the wait for an overlapped copy)
    write_s: float = 0.0  # background: DCP write until every rank finished
    checksum_s: float = 0.0  # this rank: checksum of its RNG file + gathering every rank's
    commit_s: float = 0.0  # rank 0: gather checksums, manifest, rename
    size_bytes: int = 0  # rank 0: bytes in the committed checkpoint
    error: str | None = None
    end: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    future: Future | None = None
    staged: Future | None = None  # overlapped staging: done once the state is in CPU memory
    writer: Any = None
    json_error: OSError | None = None  # this rank's JSON files could not be written


_STOP = object()


class Checkpointer:
    """Saves and loads one rank's share of the training state. Create it on every rank at
    the same point (it creates a process group), call `save`/`wait`/`close` on all ranks."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        root: Path,
        storage: Storage,
        config_text: str,
        config_hash: str,
        device: torch.device,
    ):
        self.cfg = cfg
        self.root = root
        self.storage = storage
        self.config_text = config_text  # the resolved job config, JSON
        self.config_hash = config_hash
        self.device = device
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # DCP's background collectives get a gloo group of their own (async needs a CPU
        # backend, and they must not interleave with training collectives on the default group).
        self.pg = dist.new_group(backend="gloo")
        self._stager = build_stager(device, cfg.overlap_staging) if cfg.async_save else None
        self._plans = PlanCache() if cfg.cache_plans else None
        self._pending: SaveResult | None = None
        self._finished: list[SaveResult] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(
            target=self._commit_loop, name="checkpoint-commit", daemon=True
        )
        self._worker.start()
        self._purger = Purger(storage.remove, cfg.writer_priority) if self.rank == 0 else None
        self.last_step: int | None = None

    # -- saving ------------------------------------------------------------------------
    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        train_state: dict[str, Any],
        *,
        blocking: bool = False,
    ) -> SaveResult | None:
        """Checkpoint `step`. Returns at once after staging (async), or after the commit
        (blocking or async_save=false). Skips a step already saved in this job."""
        if step == self.last_step:  # already saved (or resumed from) this step
            if blocking:
                self._wait_pending()
            return None
        start = time.time()
        t0 = time.perf_counter()
        self._wait_pending()
        waited = time.perf_counter() - t0
        self.last_step = step
        tmp = tmp_path(self.root, step)
        result = SaveResult(step=step, path=tmp, start=start, wait_previous_s=waited)
        try:
            try:
                self._write_json(tmp, train_state)
            except OSError as exc:
                # The other ranks enter DCP's collectives next: take part, fail after them
                # (in the commit loop), so that no rank waits for this one until a timeout.
                result.json_error = exc
            state = state_to_save(model, optimizer)
            writer = result.writer = self.storage.dcp_writer(tmp)
            planner = self._plans.planner() if self._plans is not None else None
            if self._stager is not None:
                writer.background_priority = self.cfg.writer_priority
                response = dcp.async_save(
                    state,
                    storage_writer=writer,
                    planner=planner,
                    process_group=self.pg,
                    async_stager=self._stager,
                )
                if isinstance(response, AsyncSaveResponse):  # staging overlaps training
                    result.staged = response.staging_completion
                    result.future = response.upload_completion
                else:
                    result.future = response
            else:
                done: Future = Future()
                try:
                    done.set_result(
                        dcp.save(
                            state, storage_writer=writer, planner=planner, process_group=self.pg
                        )
                    )
                except (Exception, CheckpointException) as exc:  # noqa: BLE001 - reported via the result
                    done.set_exception(exc)
                result.future = done
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - reported, never fatal here
            failed: Future = Future()
            failed.set_exception(exc)
            result.future = failed
        result.staging_s = time.perf_counter() - t0 - waited
        result.stall_s = time.perf_counter() - t0
        with self._lock:
            self._pending = result
        self._queue.put(result)
        if blocking or self._stager is None:
            self._wait_pending()
        return result

    def _write_json(self, tmp: Path, train_state: dict[str, Any]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.storage.write_bytes(tmp / rng_file(self.rank), to_json_bytes(capture_rng()))
        if self.rank == 0:
            self.storage.write_bytes(tmp / TRAIN_STATE, to_json_bytes(train_state))
            self.storage.write_bytes(tmp / CONFIG, self.config_text.encode())

    def _commit_loop(self) -> None:
        lower_this_thread(self.cfg.writer_priority)
        while True:
            result = self._queue.get()
            if result is _STOP:
                return
            t0 = time.perf_counter()
            try:
                result.future.result()
                result.write_s = time.perf_counter() - t0
                entries = self._gather_checksums(result)
                if result.json_error is not None:  # after the collectives every rank took part in
                    raise result.json_error
                if self.rank == 0:
                    self._commit(result, entries)
            # DCP's CheckpointException derives from BaseException: catch it explicitly.
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - keep the worker alive
                fs_error = getattr(getattr(result.writer, "fs", None), "error", None)
                result.error = _describe(fs_error or exc, result.path)
                log.error("checkpoint step %d failed: %s", result.step, result.error)
                if self.rank == 0:
                    self._discard(result.path)
            result.end = time.time()
            with self._lock:
                self._finished.append(result)
            result.done.set()

    def _gather_checksums(self, result: SaveResult) -> dict[str, FileEntry]:
        """The sizes and checksums of the files this rank wrote, gathered from every rank on
        rank 0 (over the checkpoint's group; DCP's write future succeeds or fails on all ranks
        alike, so all of them get here). The writer checksummed the shards as it wrote them;
        the RNG file is read back (rank 0 checksums .metadata itself). Raises on every rank if
        one could not checksum its files."""
        t0 = time.perf_counter()
        tmp = result.path
        try:
            report: Any = describe_files(tmp, [rng_file(self.rank)])
            report.update(
                (str(p.relative_to(tmp)), entry)
                for p, entry in result.writer.written.items()
                if p.suffix == ".distcp"
            )
        except Exception as exc:  # noqa: BLE001 - every rank must reach the gather below
            report = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        result.checksum_s = time.perf_counter() - t0
        reports: list[Any] = [report] * self.world_size  # world 1: this rank's is all
        if self.world_size > 1:
            dist.gather_object(report, reports if self.rank == 0 else None, 0, group=self.pg)
        if self.rank != 0:
            if isinstance(report, str):
                raise RuntimeError(f"checksums failed: {report}")
            return {}
        failed = [r for r in reports if isinstance(r, str)]
        if failed:
            raise RuntimeError("checksums failed: " + "; ".join(failed))
        return {rel: entry for r in reports for rel, entry in r.items()}

    def _commit(self, result: SaveResult, entries: dict[str, FileEntry]) -> None:
        t0 = time.perf_counter()
        manifest = build_manifest(
            result.path, result.step, self.world_size, self.config_hash, entries
        )
        self.storage.write_bytes(result.path / MANIFEST, manifest.to_json().encode())
        self.storage.sync_tree(result.path)  # every name in it durable before the rename
        final = committed_path(self.root, result.step)
        if self.storage.exists(final):  # a stale copy of this step from an earlier job
            self.storage.remove(final)
        self.storage.rename(result.path, final)
        result.path = final
        result.size_bytes = manifest.total_bytes
        result.commit_s = time.perf_counter() - t0
        log.info("checkpoint step %d committed: %s", result.step, final)
        self._retain()

    def _retain(self) -> None:
        assert self._purger is not None
        steps = committed_steps(self.storage, self.root)
        for step in steps_to_delete(steps, self.cfg.keep_last, self.cfg.keep_every):
            self._purger.submit(committed_path(self.root, step))

    def _discard(self, tmp: Path) -> None:
        try:
            self.storage.remove(tmp)
        except Exception as exc:  # noqa: BLE001 - the next start removes it anyway
            log.warning("could not remove failed checkpoint %s: %s", tmp, exc)

    def wait_staged(self) -> float:
        """Block until the save in flight has copied the state into CPU memory (with
        overlapped staging); call before anything changes parameters or optimizer state
        (the trainer calls it before the optimizer step). Returns the seconds waited."""
        with self._lock:
            pending = self._pending
        if pending is None or pending.staged is None:
            return 0.0
        t0 = time.perf_counter()
        futures.wait([pending.staged])  # an error reaches the commit through the upload future
        waited = time.perf_counter() - t0
        pending.staged = None
        pending.staging_s += waited
        pending.stall_s += waited
        return waited

    def _wait_pending(self) -> None:
        with self._lock:
            pending = self._pending
        if pending is not None:
            pending.done.wait()
            with self._lock:
                if self._pending is pending:
                    self._pending = None

    @property
    def in_flight(self) -> bool:
        with self._lock:
            return self._pending is not None and not self._pending.done.is_set()

    def poll(self) -> list[SaveResult]:
        """Saves that finished (committed or failed) since the last call."""
        with self._lock:
            done, self._finished = self._finished, []
        return done

    def wait(self) -> list[SaveResult]:
        """Block until the save in flight (if any) finished; then `poll()`."""
        self._wait_pending()
        return self.poll()

    def close(self) -> None:
        """Finish the save in flight, stop the workers."""
        self._wait_pending()
        self._queue.put(_STOP)
        self._worker.join()
        if self._purger is not None:
            self._purger.close()
        if self._stager is not None:
            self._stager.close()
        if self._plans is not None:
            self._plans.clear()

    # -- loading (toolkit.checkpoint.loading) -------------------------------------------
    def check_fits(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Raise CheckpointMismatch when the checkpoint's tensors do not fit the model (keys,
        shapes), reading only its metadata: nothing is touched."""
        check_fits(path, self.storage.dcp_reader(path), model, optimizer)

    def load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Load model and optimizer shards (any world size) from `path`; returns the trainer
        state (JSON) and this rank's RNG state (None when the checkpoint had no such rank).
        Checks keys and shapes against the model first: nothing is touched on a mismatch.
        Non-tensor items are read as plain data only (toolkit.checkpoint.trust)."""
        load_into(path, self.storage.dcp_reader(path), model, optimizer, self.pg)
        train_state, rng = read_train_state(path, self.rank)
        self.last_step = int(train_state["step"])
        return train_state, rng


def state_to_save(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What a save writes: DCP's state dicts of model and optimizer (sharded as they are). The
    save path's one call of get_state_dict (the load path's: loading.load_into)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _describe(exc: BaseException, path: Path) -> str:
    """One readable line for a failed save: the root OSError (with its path) when there is one."""
    seen: list[BaseException] = []
    stack: list[Any] = [exc]
    while stack:
        e = stack.pop()
        if isinstance(e, BaseException) and e not in seen:
            seen.append(e)
            if isinstance(e, OSError):
                return f"{type(e).__name__}: {e} (checkpoint {path})"
            stack += [e.__cause__, e.__context__]
            failures = getattr(e, "failures", None)  # DCP CheckpointException: rank -> (exc, tb)
            if isinstance(failures, dict):
                for value in failures.values():
                    stack.append(value[0] if isinstance(value, tuple) else value)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {first} (checkpoint {path})"
