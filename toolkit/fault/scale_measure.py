"""The measured constants of the recovery simulation (toolkit.fault.scale_sim), taken on this
machine with the real components: a TCPStore on loopback, DCP's save planner, the checkpoint
manifest, and store operations counted on real gloo ranks.

Nothing here is a model: each function runs the thing and times or counts it.
"""

from __future__ import annotations

import collections
import datetime
import json
import multiprocessing
import os
import pickle
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STORE_OPS = ("set", "get", "add", "wait", "compare_set", "check", "delete_key", "num_keys")


class CountingStore(dist.Store):
    """A store that counts each operation torch.distributed makes on it, then forwards it to
    a real TCPStore (a Python subclass of dist.Store is what c10d calls through)."""

    def __init__(self, inner: dist.Store):
        super().__init__()
        self.inner = inner
        self.ops: collections.Counter[str] = collections.Counter()
        self.bytes: collections.Counter[str] = collections.Counter()  # values set and got

    def set(self, key: str, value: Any) -> None:
        self.ops["set"] += 1
        self.bytes["set"] += len(value)
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.ops["get"] += 1
        value = self.inner.get(key)
        self.bytes["get"] += len(value)
        return value

    def add(self, key: str, amount: int) -> int:
        self.ops["add"] += 1
        return self.inner.add(key, amount)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self.ops["compare_set"] += 1
        return self.inner.compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self.ops["wait"] += 1
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self.ops["check"] += 1
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        self.ops["delete_key"] += 1
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        self.ops["num_keys"] += 1
        return self.inner.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.inner.set_timeout(timeout)


def _count_rank(rank: int, world: int, port: int, out: Any) -> None:
    """One gloo rank: the default group as toolkit.distributed.init builds it on CPU, then the
    checkpointer's own gloo group (toolkit.checkpoint.checkpointer: dist.new_group)."""
    torch.set_num_threads(1)
    inner = dist.TCPStore(
        "127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=120)
    )
    store = CountingStore(inner)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    default_group, default_bytes = dict(store.ops), dict(store.bytes)
    dist.new_group(backend="gloo")
    total, total_bytes = dict(store.ops), dict(store.bytes)
    dist.barrier()
    dist.destroy_process_group()
    checkpoint_group = {k: total[k] - default_group.get(k, 0) for k in total}
    checkpoint_bytes = {k: total_bytes[k] - default_bytes.get(k, 0) for k in total_bytes}
    out.put((rank, default_group, checkpoint_group, default_bytes, checkpoint_bytes))


def count_store_ops(world: int) -> dict[int, dict[str, dict[str, int]]]:
    """Every rank's store operations while joining the default gloo group and creating the
    checkpointer's gloo group, on `world` real gloo processes on loopback:
    {rank: {"default_group": {op: n}, "checkpoint_group": {op: n}, "default_group_bytes":
    {"set": bytes, "get": bytes}, "checkpoint_group_bytes": {...}}}."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_count_rank, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return {
        r: {
            "default_group": d,
            "checkpoint_group": c,
            "default_group_bytes": db,
            "checkpoint_group_bytes": cb,
        }
        for r, d, c, db, cb in sorted(results)
    }


def store_throughput(clients: int, ops_per_client: int = 200) -> dict[str, float]:
    """Aggregate set+get operations per second that one TCPStore server on loopback serves to
    `clients` concurrent clients (threads, each its own connection), and the median latency
    of one operation."""
    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def work(i: int) -> None:
        conn = dist.TCPStore("127.0.0.1", server.port, 1, False)
        own: list[float] = []
        start.wait()
        for k in range(ops_per_client // 2):
            t0 = time.perf_counter()
            conn.set(f"c{i}/{k}", b"x" * 64)
            conn.get(f"c{i}/{k}")
            own.append((time.perf_counter() - t0) / 2)
        with lock:
            latencies.extend(own)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()  # every client connected
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ops = clients * (ops_per_client // 2) * 2
    return {
        "clients": clients,
        "ops_per_s": ops / wall,
        "op_median_s": statistics.median(latencies),
    }


def store_rates(clients: tuple[int, ...], repeats: int = 3) -> list[dict[str, float]]:
    """store_throughput at each client count, `repeats` times interleaved; the medians."""
    runs: dict[int, list[dict[str, float]]] = {c: [] for c in clients}
    for _ in range(repeats):
        for c in clients:
            runs[c].append(store_throughput(c))
    return [
        {
            "clients": c,
            "ops_per_s": statistics.median(r["ops_per_s"] for r in runs[c]),
            "op_median_s": statistics.median(r["op_median_s"] for r in runs[c]),
        }
        for c in clients
    ]


def _plan_state(layers: int) -> dict[str, torch.Tensor]:
    """A transformer-like state dict as the checkpointer saves it: every parameter with its
    Adam state (exp_avg, exp_avg_sq, step), under long fully qualified names."""
    names = ["attention.wq", "attention.wk", "attention.wv", "attention.wo"]
    names += ["feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]
    names += ["attention_norm", "ffn_norm"]
    state: dict[str, torch.Tensor] = {}
    for i in range(layers):
        for n in names:
            fqn = f"model.layers.{i}.{n}.weight"
            state[fqn] = torch.zeros(8, 8)
            for s in ("exp_avg", "exp_avg_sq"):
                state[f"optim.state.{fqn}.{s}"] = torch.zeros(8, 8)
            state[f"optim.state.{fqn}.step"] = torch.zeros(())
    return state


def plan_costs(layers: int = 8, repeats: int = 20) -> dict[str, float]:
    """Bytes of one rank's pickled DCP save plan per write item (what rank 0 gathers), and
    the time rank 0 takes to unpickle it, per item (DCP's DefaultSavePlanner, no group)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner()
    planner.set_up_planner(_plan_state(layers), storage_meta=None, is_coordinator=True)
    plan = planner.create_local_plan()
    blob = pickle.dumps(plan)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pickle.loads(blob)  # noqa: S301 - our own bytes, just made
        times.append(time.perf_counter() - t0)
    items = len(plan.items)
    return {
        "items": items,
        "plan_bytes_per_item": len(blob) / items,
        "unpickle_s_per_item": statistics.median(times) / items,
    }


def metadata_costs(chunks: int = 64, tensors: int = 16) -> dict[str, float]:
    """Bytes per shard (chunk) of DCP's global `.metadata`, which every rank reads on load,
    and the time to unpickle it per chunk: a real Metadata object for `tensors` tensors
    sharded in `chunks` row blocks, pickled at two sizes (the difference is the per-chunk
    cost)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    def pickled(n: int) -> bytes:
        sd_meta, storage = {}, {}
        for t in range(tensors):
            fqn = f"optim.state.model.layers.{t}.attention.wq.weight.exp_avg"
            cs = [
                ChunkStorageMetadata(torch.Size([r * 64, 0]), torch.Size([64, 8192]))
                for r in range(n)
            ]
            sd_meta[fqn] = TensorStorageMetadata(
                TensorProperties(dtype=torch.float32), torch.Size([64 * n, 8192]), cs
            )
            for r, c in enumerate(cs):
                storage[MetadataIndex(fqn, c.offsets, r)] = _StorageInfo(
                    f"__{r}_0.distcp", 4096 * r, 64 * 8192 * 4
                )
        return pickle.dumps(Metadata(sd_meta, storage_data=storage))

    big, small = pickled(chunks), pickled(chunks // 2)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        pickle.loads(big)  # noqa: S301 - our own bytes, just made
        times.append(time.perf_counter() - t0)
    return {
        "metadata_bytes_per_chunk": (len(big) - len(small)) / (chunks - chunks // 2) / tensors,
        "metadata_unpickle_s_per_chunk": statistics.median(times) / (chunks * tensors),
    }


def manifest_costs(ranks: int = 256) -> dict[str, float]:
    """The checkpoint manifest of a `ranks`-rank save (a .distcp and an RNG file per rank):
    JSON bytes per listed file, the time to parse it per file (every rank does at resume),
    and one stat of a file on this machine's local disk (every rank stats every file)."""
    from toolkit.checkpoint.manifest import FileEntry, Manifest

    files = {f"__{r}_0.distcp": FileEntry(123_456_789, "0" * 16) for r in range(ranks)}
    files.update({f"rng-rank{r:05d}.json": FileEntry(1234, "0" * 16) for r in range(ranks)})
    text = Manifest(1000, ranks, "0" * 16, time.time(), files).to_json()
    parse = []
    for _ in range(10):
        t0 = time.perf_counter()
        Manifest.from_json(text)
        parse.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"f{i}" for i in range(200)]
        for p in paths:
            p.write_bytes(b"x")
        t0 = time.perf_counter()
        for _ in range(5):
            for p in paths:
                p.stat()
        stat_s = (time.perf_counter() - t0) / (5 * len(paths))
    return {
        "manifest_bytes_per_file": len(text) / len(files),
        "manifest_parse_s_per_file": statistics.median(parse) / len(files),
        "local_stat_s": stat_s,
    }


def measure_all(clients: tuple[int, ...] = (1, 8, 32, 128)) -> dict[str, Any]:
    """Every constant the simulation uses, measured now on this machine."""
    return {
        "store": store_rates(clients),
        "plan": plan_costs(),
        "metadata": metadata_costs(),
        "manifest": manifest_costs(),
        "store_ops_counted": {str(w): count_store_ops(w) for w in (2, 4)},
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
    }


if __name__ == "__main__":
    print(json.dumps(measure_all(), indent=1))
