"""The recovery protocol at 128, 1,024 and 8,192 ranks, on paper (issue 48, item 5).

    python -m toolkit.fault.scale_sim [--ranks 128 1024 8192] [--params 70e9] [--json]
    toolkit bench recovery-scale ...

What a recovery does, phase by phase, counted from the code as it is today and costed with
constants measured on this machine (toolkit.fault.scale_measure: a real TCPStore on
loopback, DCP's real save planner, the real manifest, store operations counted on real gloo
ranks) and published link figures. Messages and bytes through rank 0 and through the store
are counts; times are those counts divided by a measured or named rate.

detect        a rank's exit: the launcher polls its ranks (Slurm executor POLL_S); a hang:
              the watchdog's limit + its poll, the stacks' wait and the node files' gather
              (toolkit.telemetry.watchdog); a node loss: Slurm's SlurmdTimeout (default 300 s)
rendezvous    every rank joins the default group (NCCL on GPU, gloo on CPU) and the
              checkpointer's gloo group through one TCPStore (toolkit.distributed.init,
              toolkit.checkpoint.checkpointer: dist.new_group(backend="gloo")). Gloo connects
              a full mesh: each rank sets its address once and waits for and gets every
              rank's (counted: 1 set + N wait + N get per rank and group), so the store serves
              N(2N+1) operations per gloo group. NCCL: rank 0 sets the unique id, every other
              rank waits for and gets it (ProcessGroupNCCL; not counted here: no GPU)
replica       issue 48: each rank's shard of the training state (params x bytes_per_param / N)
              goes to a peer on another node; on recovery the replacement's ranks get theirs
              back from those peers, one link each; nothing passes through rank 0 or the store
dcp_plan      a DCP save or load: rank 0 gathers every rank's plan (items per rank x measured
              bytes per item), unpickles it and scatters the final plans back; every rank
              then reads the global .metadata (one chunk entry per rank and tensor) three
              times (check_fits, load_into's check, DCP's own)
manifest      resume (toolkit.checkpoint.resume.choose_together): every rank reads the whole
              manifest (2 files per rank + 3), stats and checksums 1/N of the files; rank 0
              lists the directory and unpickles .metadata; one all_gather of the verdicts.
              At save, rank 0 gathers every rank's file checksums
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

# Published figures (named; not measured here).
IB_NDR_BYTES_PER_S = 400e9 / 8  # InfiniBand NDR, 400 Gb/s per port (one port per GPU, as DGX H100)
SLURMD_TIMEOUT_S = 300.0  # slurm.conf SlurmdTimeout default: a node that stops answering is DOWN
REQUEUE_ELIGIBLE_S = 120.0  # Slurm: a requeued job is eligible after this (issue 48's figure)


@dataclass(frozen=True)
class Constants:
    """The rates the simulation divides by. Measured ones come from scale_measure."""

    store_op_s: float  # one store operation, one client, loopback (measured)
    store_ops_per_s: float  # what one TCPStore server serves at the most clients measured
    plan_bytes_per_item: float  # pickled DCP save plan, per write item (measured)
    unpickle_s_per_item: float  # rank 0 unpickling a gathered plan, per item (measured)
    metadata_bytes_per_chunk: float  # DCP .metadata per shard of a tensor (measured)
    metadata_unpickle_s_per_chunk: float  # unpickling it, per shard (measured)
    manifest_bytes_per_file: float  # manifest JSON per listed file (measured)
    manifest_parse_s_per_file: float  # parsing it, per file (measured)
    gloo_address_bytes: float = 178.0  # one rank's address in the store (measured: counted)
    link_bytes_per_s: float = IB_NDR_BYTES_PER_S
    # Assumed, not measured (no parallel file system here): a shared file system's metadata
    # operations (stat, readdir entry) per second, all clients together.
    fs_metadata_ops_per_s: float = 100_000.0
    fs_bytes_per_s: float = 1e12  # assumed: the shared file system's read rate, all clients
    launcher_poll_s: float = 0.5  # toolkit.executors.slurm POLL_S
    hang_timeout_s: float = 300.0  # watchdog MIN_DEFAULT_TIMEOUT_S (fault.hang_timeout_s=null)
    hang_overhead_s: float = 0.5 + 2.0 + 15.0  # POLL_S + DUMP_WAIT_S + GATHER_S at most


@dataclass(frozen=True)
class Job:
    """The job being recovered."""

    ranks: int
    ranks_per_node: int = 8
    params: float = 70e9  # Llama-3-70B size
    bytes_per_param: float = 12.0  # fp32 params + Adam exp_avg, exp_avg_sq (the saved state)
    param_tensors: int = 723  # 80 layers x 9 + 3 (Llama-3-70B)
    items_per_tensor: int = 4  # the parameter, exp_avg, exp_avg_sq, step
    gpu: bool = True  # default group on NCCL (else gloo)


@dataclass
class Phase:
    name: str
    seconds: float
    rank0_messages: int = 0
    rank0_bytes: float = 0.0
    store_ops: int = 0
    store_bytes: float = 0.0  # values set into and got from the store
    fs_ops: int = 0  # shared file system metadata operations (stat, readdir entry)
    fs_bytes: float = 0.0  # bytes read from the shared file system, all ranks together
    note: str = ""


@dataclass
class Recovery:
    ranks: int
    phases: list[Phase] = field(default_factory=list)

    @property
    def memory_path_s(self) -> float:
        """Issue 48's in-job restart from peers' memory: no DCP planning, no manifest read."""
        return sum(p.seconds for p in self.phases if p.name in ("detect", "rendezvous", "replica"))

    @property
    def disk_path_s(self) -> float:
        """Today's path after the requeue wait: resume from a disk checkpoint (the read of
        the shards themselves is not counted: it is the file system's bandwidth)."""
        return REQUEUE_ELIGIBLE_S + sum(p.seconds for p in self.phases if p.name != "replica")


def gloo_store_ops(ranks: int) -> dict[str, int]:
    """Store operations of one gloo group's creation, per rank (counted on real gloo ranks:
    scale_measure.count_store_ops; a test checks this against the count)."""
    return {"set": 1, "wait": ranks, "get": ranks}


def nccl_store_ops(ranks: int, rank: int) -> dict[str, int]:
    """Store operations of one NCCL communicator's creation (rank 0 publishes the unique id)."""
    return {"set": 1} if rank == 0 else {"wait": 1, "get": 1}


def rendezvous(job: Job, c: Constants) -> Phase:
    n = job.ranks
    per_gloo = sum(gloo_store_ops(n).values())
    gloo_groups = 1 if job.gpu else 2  # the checkpointer's, and the default one on CPU
    total = gloo_groups * n * per_gloo
    rank0 = gloo_groups * per_gloo
    if job.gpu:
        total += sum(sum(nccl_store_ops(n, r).values()) for r in (0, 1)) + (n - 2) * 2
        rank0 += 1
    # The server serves them at its measured rate; no rank finishes before its own ops ran
    # one after another at the single-client latency.
    seconds = max(total / c.store_ops_per_s, gloo_groups * per_gloo * c.store_op_s)
    # gloo: each rank's address set once and got by every rank; NCCL: a 128-byte unique id
    # (NCCL_UNIQUE_ID_BYTES) set once and got by every other rank
    store_bytes = gloo_groups * n * (n + 1) * c.gloo_address_bytes + (n * 128 if job.gpu else 0)
    return Phase(
        "rendezvous",
        seconds,
        rank0_messages=rank0,
        store_ops=total,
        store_bytes=store_bytes,
        note=f"{gloo_groups} gloo group(s): N(2N+1) store ops each; {n * (n - 1) // 2} TCP "
        f"connections and {n - 1} sockets per rank each",
    )


def replica(job: Job, c: Constants) -> Phase:
    shard = job.params * job.bytes_per_param / job.ranks
    return Phase(
        "replica",
        shard / c.link_bytes_per_s,
        note=f"{shard / 1e9:.2f} GB per rank to/from a peer on another node, one link each",
    )


def metadata_chunks(job: Job) -> int:
    """Entries of DCP's global .metadata: FSDP shards every parameter and its Adam moments
    across all ranks (one chunk per rank each); the step scalars are replicated (one each)."""
    return job.ranks * job.param_tensors * (job.items_per_tensor - 1) + job.param_tensors


def dcp_plan(job: Job, c: Constants) -> Phase:
    n = job.ranks
    items = job.param_tensors * job.items_per_tensor
    plans = n * items * c.plan_bytes_per_item  # gathered in, and about as much scattered out
    metadata = metadata_chunks(job) * c.metadata_bytes_per_chunk
    # per rank at resume: the hook's check_fits, load_into's raise_if_mismatched, then DCP's
    # own local step, each through a reader of its own
    reads = 3
    seconds = (
        2 * plans / c.link_bytes_per_s
        + n * items * c.unpickle_s_per_item
        + reads * metadata_chunks(job) * c.metadata_unpickle_s_per_chunk  # every rank, at once
        + reads * n * metadata / c.fs_bytes_per_s  # every rank reads the whole .metadata
    )
    return Phase(
        "dcp_plan",
        seconds,
        rank0_messages=2 * (n - 1),
        rank0_bytes=2 * plans,
        fs_bytes=reads * n * metadata,
        note=f"load or first save after a restart; .metadata {metadata / 1e9:.2f} GB, read "
        f"{reads}x by every rank",
    )


def manifest(job: Job, c: Constants) -> Phase:
    """resume.choose_together as it is: each rank reads the manifest, stats its share of the
    files and checksums it; rank 0 lists the directory and unpickles .metadata."""
    n = job.ranks
    files = 2 * n + 3
    metadata = metadata_chunks(job) * c.metadata_bytes_per_chunk
    fs_ops = 2 * files  # one stat per listed file (its owner's), one entry in rank 0's listing
    fs_bytes = n * files * c.manifest_bytes_per_file + metadata + job.params * job.bytes_per_param
    seconds = (
        fs_ops / c.fs_metadata_ops_per_s
        + files * c.manifest_parse_s_per_file
        + metadata_chunks(job) * c.metadata_unpickle_s_per_chunk  # rank 0
        + fs_bytes / c.fs_bytes_per_s
    )
    return Phase(
        "manifest",
        seconds,
        rank0_messages=n - 1,  # the verdicts' all_gather (and the checksums' gather at save)
        rank0_bytes=files * c.manifest_bytes_per_file,  # written at save, read by every rank
        fs_ops=fs_ops,
        fs_bytes=fs_bytes,
        note=f"{files} files listed, read by every rank; stats split across ranks (every rank "
        f"stating all: {n * 2 * files:,}); the checksums read the checkpoint once",
    )


def load(job: Job, c: Constants) -> Phase:
    state = job.params * job.bytes_per_param
    return Phase("load", state / c.fs_bytes_per_s, fs_bytes=state, note="the shards, from disk")


def detect(job: Job, c: Constants, cause: str) -> Phase:
    nodes = -(-job.ranks // job.ranks_per_node)
    if cause == "exit":
        return Phase("detect", c.launcher_poll_s, note="a rank's exit, seen by the launcher")
    if cause == "node":
        return Phase("detect", SLURMD_TIMEOUT_S, note="a node lost: Slurm's SlurmdTimeout")
    return Phase(
        "detect",
        c.hang_timeout_s + c.hang_overhead_s,
        fs_ops=2 * nodes,  # each node's file written, then read by the claiming agent
        note=f"a hang: {nodes} node files gathered by the claiming agent",
    )


def simulate(job: Job, c: Constants, cause: str = "hang") -> Recovery:
    return Recovery(
        job.ranks,
        [
            detect(job, c, cause),
            rendezvous(job, c),
            replica(job, c),
            dcp_plan(job, c),
            manifest(job, c),
            load(job, c),
        ],
    )


def constants_from(measured: dict[str, Any], **overrides: float) -> Constants:
    single = min(measured["store"], key=lambda s: s["clients"])
    most = max(measured["store"], key=lambda s: s["clients"])
    return Constants(
        store_op_s=single["op_median_s"],
        store_ops_per_s=most["ops_per_s"],
        plan_bytes_per_item=measured["plan"]["plan_bytes_per_item"],
        unpickle_s_per_item=measured["plan"]["unpickle_s_per_item"],
        metadata_bytes_per_chunk=measured["metadata"]["metadata_bytes_per_chunk"],
        metadata_unpickle_s_per_chunk=measured["metadata"]["metadata_unpickle_s_per_chunk"],
        manifest_bytes_per_file=measured["manifest"]["manifest_bytes_per_file"],
        manifest_parse_s_per_file=measured["manifest"]["manifest_parse_s_per_file"],
        gloo_address_bytes=measured["store_ops_counted"]["2"][0]["default_group_bytes"]["set"],
        **overrides,
    )


def table(recoveries: list[Recovery]) -> str:
    lines = [
        "| ranks | phase | seconds | msgs via rank 0 | bytes via rank 0 | store ops | store bytes "
        "| FS metadata ops | FS bytes read | note |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in recoveries:
        for p in r.phases:
            lines.append(
                f"| {r.ranks:,} | {p.name} | {p.seconds:,.2f} | {p.rank0_messages:,} | "
                f"{p.rank0_bytes / 1e6:,.1f} MB | {p.store_ops:,} | {p.store_bytes / 1e6:,.1f} MB | "
                f"{p.fs_ops:,} | "
                f"{p.fs_bytes / 1e9:,.1f} GB | {p.note} |"
            )
        lines.append(
            f"| {r.ranks:,} | **total** | memory {r.memory_path_s:,.1f} / disk {r.disk_path_s:,.1f} "
            "| | | | | | | memory: detect + rendezvous + replica; disk: detect + 120 s requeue + "
            "rendezvous + DCP planning + manifest + load |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="toolkit bench recovery-scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[128, 1024, 8192])
    parser.add_argument("--params", type=float, default=70e9)
    parser.add_argument("--cause", choices=("exit", "hang", "node"), default="hang")
    parser.add_argument("--fs-metadata-ops-per-s", type=float, default=100_000.0)
    parser.add_argument("--fs-bytes-per-s", type=float, default=1e12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if (
        any(n < 2 for n in args.ranks)
        or args.params <= 0
        or min(args.fs_metadata_ops_per_s, args.fs_bytes_per_s) <= 0
    ):
        print(
            "error: --ranks must be >= 2, --params and the file system rates > 0", file=sys.stderr
        )
        return 2
    from toolkit.fault.scale_measure import measure_all

    measured = measure_all()
    c = constants_from(
        measured,
        fs_metadata_ops_per_s=args.fs_metadata_ops_per_s,
        fs_bytes_per_s=args.fs_bytes_per_s,
    )
    recoveries = [simulate(Job(n, params=args.params), c, args.cause) for n in args.ranks]
    if args.json:
        out = {"measured": measured, "constants": asdict(c)}
        out["recoveries"] = [
            {
                "ranks": r.ranks,
                "memory_path_s": r.memory_path_s,
                "disk_path_s": r.disk_path_s,
                "phases": [asdict(p) for p in r.phases],
            }
            for r in recoveries
        ]
        print(json.dumps(out, indent=1))
        return 0
    print("constants:", json.dumps(asdict(c)))
    print("store:", json.dumps(measured["store"]))
    print("store ops counted on gloo ranks:", json.dumps(measured["store_ops_counted"]))
    print(table(recoveries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
