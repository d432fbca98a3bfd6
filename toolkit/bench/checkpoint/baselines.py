"""The stall benchmark's baselines, timed in the same rotation of windows as the async saves
(toolkit.bench.checkpoint.windows): a blocking DCP save of the same state (`sync_dcp_save`),
the simplest async checkpoint (`BackgroundRawWrite`), and another process doing as much CPU
work beside training as a save does (`Neighbour`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from toolkit.bench.checkpoint.shared import raw_write


def sync_dcp_save(state: dict[str, Any], path: Path, pg: Any) -> float:
    """Baseline: a plain blocking DCP save of the same state (no manifest, no checksums)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    t0 = time.perf_counter()
    dcp.save(state, storage_writer=FileSystemWriter(path), process_group=pg)
    return time.perf_counter() - t0


class BackgroundRawWrite:
    """Baseline for the lost time: the simplest async checkpoint. Copy this rank's
    tensors into one CPU buffer on the training thread, then write it with plain file
    writes + fsync in a thread (no DCP, no checksums, no manifest)."""

    def __init__(self, tensors: list[Any], path: Path):
        import threading

        import torch

        t0 = time.perf_counter()
        total = sum(t.numel() * t.element_size() for t in tensors)
        self.buffer = torch.empty(total, dtype=torch.uint8)
        offset = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            self.buffer[offset : offset + n].copy_(t.detach().reshape(-1).view(torch.uint8))
            offset += n
        self.staging_s = time.perf_counter() - t0
        self.path = path
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        _, self.write_s = raw_write([self.buffer], self.path)

    def wait(self) -> None:
        self.thread.join()


def _neighbour_loop(conn: Any, priority: str, buffer_bytes: int) -> None:
    """The neighbour process: on each request, copy memory until it used that many CPU
    seconds, then report the CPU seconds it used; None ends it."""
    import numpy as np

    from toolkit.checkpoint.priority import lower_this_thread

    lower_this_thread(priority)
    src = np.ones(buffer_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    while (seconds := conn.recv()) is not None:
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            dst[:] = src
        conn.send(time.process_time() - t0)


class Neighbour:
    """Baseline for what any CPU work beside training costs it on this machine: another
    process, at the checkpoint writer's priority, copying memory (buffers far larger than
    the CPU caches, as a save streams its state) for a given number of CPU seconds. It
    shares no GIL and no tensors with training, so on a machine whose cores are independent
    it costs training nothing; where the "spare" core shares the physical core or memory
    bandwidth with training's (SMT siblings, a busy VM host), it shows how much."""

    def __init__(self, priority: str, buffer_bytes: int = 512 << 20):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_neighbour_loop, args=(child, priority, buffer_bytes), daemon=True
        )
        self.process.start()
        self.conn.send(0.0)  # wait until it is up and its buffers are allocated
        self.conn.recv()

    def start(self, cpu_s: float) -> None:
        self.conn.send(cpu_s)

    def wait(self) -> float:
        """The CPU seconds the neighbour used for the last request."""
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=10)
