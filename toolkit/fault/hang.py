"""A hang's evidence on disk: RUN_DIR/hangs/<UTC time>/summary.json and the stack dumps.

One module writes and reads the summary (the node agent's watchdog writes it, the
launcher, the report and the requeue decision read it), and owns the stack-dump signal
that every rank installs at start:

    RUN_DIR/hangs/<20261201T031500Z>/summary.json     who is stuck, where, for how long
    RUN_DIR/hangs/<20261201T031500Z>/stacks-rank<k>.txt  every thread's Python stack
    RUN_DIR/hangs/<20261201T031500Z>/node-<host>.json  what each node's agent saw

`diagnose` is the pure part: from every rank's last heartbeat (step, the collective it last
entered, the collective it is blocked in), the ranks that did not reach the collective the
others wait in.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import IO, Any

from toolkit.files import write_private

# The signal that makes a rank write its stacks (faulthandler, installed at start in every
# rank). Not SIGUSR1/SIGUSR2/SIGTERM/SIGINT (cluster.signal and preemption, Slurm's
# --signal, submitit's handlers), not SIGABRT/SIGSEGV/SIGBUS (crashes: faulthandler's own
# fatal handler, NCCL's async error handling aborts), not SIGCHLD/SIGALRM/SIGPIPE (the
# runtime uses them), not SIGPWR (Boehm GC and some init systems). glibc reserves the
# first real-time signals for its threads; Python's signal.SIGRTMIN is the first free one,
# and neither NCCL, CUDA, gloo, submitit nor Slurm use SIGRTMIN+6. Its default action
# (terminate) never applies: the handler is installed before the agent can send it.
DUMP_SIGNAL = signal.SIGRTMIN + 6

SUMMARY = "summary.json"
REQUIRED_KEYS = (
    "stuck_ranks",
    "stuck_hosts",
    "waiting_ranks",
    "collective",
    "stuck_for_s",
    "step",
    "message",
    "hosts_by_rank",
)


def hangs_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "hangs"


def new_hang_dir(run_dir: Path, now_unix: float | None = None) -> Path:
    """RUN_DIR/hangs/<UTC time>/, created 0700 (a second hang in the same second: -2, -3...)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_unix or time.time()))
    base = hangs_dir(run_dir)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    for i in range(1, 100):
        path = base / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}/{stamp}: too many hangs in one second")


def write_hang_summary(directory: Path, summary: dict[str, Any]) -> Path:
    missing = [k for k in REQUIRED_KEYS if k not in summary]
    if missing:
        raise ValueError(f"hang summary: missing {missing}")
    path = Path(directory) / SUMMARY
    write_private(path, json.dumps(summary, indent=2, sort_keys=True))
    return path


def read_hang_summary(path: Path) -> dict[str, Any]:
    """A hang summary (the file, or its hang directory); ValueError when it is not one."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"hang summary {path}: {exc}") from None
    if not isinstance(summary, dict):
        raise ValueError(f"hang summary {path}: not a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in summary]
    if missing:
        raise ValueError(f"hang summary {path}: missing {missing}")
    return summary


def hang_summaries(run_dir: Path, since_unix: float = 0.0) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable hang summary of the run written at or after `since_unix`, oldest first."""
    found = []
    for path in sorted(hangs_dir(run_dir).glob(f"*/{SUMMARY}")):
        try:
            if path.stat().st_mtime + 1.0 < since_unix:  # 1 s: coarse file-system clocks
                continue
            found.append((path, read_hang_summary(path)))
        except (OSError, ValueError):
            continue
    return found


# -- the rank side: stacks on a signal -----------------------------------------------------
def pending_stack_file(run_dir: Path, rank: int, pid: int) -> Path:
    """Where rank `rank` (process `pid`) writes its stacks on DUMP_SIGNAL; the agent moves
    the text into the hang directory."""
    return hangs_dir(run_dir) / ".stacks" / f"rank{rank}.{pid}.txt"


_dump_file: IO[str] | None = None
_dump_path: Path | None = None


def install_stack_dump(run_dir: Path, rank: int) -> Path | None:
    """Every thread's stack into pending_stack_file(...) on DUMP_SIGNAL (async-signal-safe:
    faulthandler writes from C, so a rank blocked in a collective or a sleep still dumps).
    Best effort: None when it cannot be installed."""
    global _dump_file, _dump_path
    path = pending_stack_file(run_dir, rank, os.getpid())
    try:
        hangs_dir(run_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        path.parent.mkdir(exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        _dump_file = os.fdopen(fd, "w")
        faulthandler.register(DUMP_SIGNAL, file=_dump_file, all_threads=True, chain=False)
        _dump_path = path
    except (OSError, RuntimeError, ValueError):
        return None
    return path


def remove_stack_dump() -> None:
    """At a clean exit: unregister and remove the pending file when nothing was dumped."""
    global _dump_file, _dump_path
    if _dump_file is None:
        return
    with contextlib.suppress(Exception):
        faulthandler.unregister(DUMP_SIGNAL)
        _dump_file.close()
        if _dump_path is not None and _dump_path.stat().st_size == 0:
            _dump_path.unlink()
    _dump_file = _dump_path = None


# -- the pure part ------------------------------------------------------------------------
# Ranks whose progress stopped within this of the first to stop are named together: an agent
# sees a rank move up to one heartbeat poll (0.5 s) late, a script's wrapper up to 0.2 s. They
# are compared by moved_unix (wall clock), not idle_s: each agent measures idle_s at its own
# snapshot, and two nodes' snapshots are up to a claim poll and a dump apart.
SAME_STOP_S = 1.0


# torch.distributed's collectives and point-to-point calls, as their Python frames in
# distributed_c10d.py name them: a rank whose stack holds one of them is waiting there.
COLLECTIVES = frozenset(
    [
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "send",
        "recv",
        "batch_isend_irecv",
    ]
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+ in (?P<func>\S+)', re.MULTILINE)


AUTOGRAD_ENGINE_FILE = "torch/autograd/graph.py"


def _torch_path(path: str) -> str:
    """A frame's file from its torch/ package directory on (the path as is elsewhere)."""
    path = path.replace("\\", "/")
    cut = path.rfind("/torch/")
    return path[cut + 1 :] if cut >= 0 else path


def collective_in_stacks(text: str) -> str | None:
    """What a rank's stack dump (faulthandler's text, every thread, most recent call first)
    shows it waiting in on its peers: a thread's first frame in torch/distributed/
    distributed_c10d.py that is a collective (its name); "backward" for a thread whose
    innermost frame is autograd's engine (DDP's and FSDP's gradient reductions are waited
    for there, in C++, with no Python frame of their own); else the function of a thread
    whose innermost frame is in torch/distributed/ (an async collective's wait() inside
    FSDP's code, a rendezvous waiting for the other ranks to join). None when no thread is
    in any (the rank is elsewhere: its own code, a sleep, data loading)."""
    innermost = None
    for thread in re.split(r"^(?:Current thread|Thread) 0x[0-9a-f]+", text, flags=re.MULTILINE):
        frames = [(_torch_path(f["file"]), f["func"]) for f in _FRAME.finditer(thread)]
        c10d = next((f for p, f in frames if p == "torch/distributed/distributed_c10d.py"), None)
        if c10d in COLLECTIVES:
            return c10d
        if frames and frames[0] == (AUTOGRAD_ENGINE_FILE, "_engine_run_backward"):
            return "backward"
        if frames and frames[0][0].startswith("torch/distributed/") and innermost is None:
            innermost = frames[0][1]
    return innermost


def diagnose(
    ranks: list[dict[str, Any]], stack_ops: dict[int, str | None] | None = None
) -> dict[str, Any]:
    """Stuck and waiting ranks from every rank's last heartbeat.

    Each entry: rank, host, step, entered_seq, entered_op, blocked_seq (0: not blocked in a
    collective), blocked_op, idle_s (seconds without progress), moved_unix (when its agent
    last saw it move, wall clock). The collective the others wait in is the earliest one a
    rank is blocked in; the ranks that never entered it are stuck. When every blocked rank
    has entered it too (a rank stuck inside it while others passed, or nobody blocked), the
    ranks that stopped first (within SAME_STOP_S) are named.

    `stack_ops` (rank -> collective_in_stacks of its dump, for the ranks that dumped) decide
    where the heartbeats know of no collective (a script's ranks: its wrapper sees CPU time
    and output, not torch.distributed): the ranks whose stacks wait in a collective are
    waiting, the others stuck; the collective's `seq` is then null (`from`: stacks)."""
    blocked = [r for r in ranks if r["blocked_seq"] > 0]
    collective = None
    waiting: list[int] = []
    stuck: list[dict[str, Any]] = []
    if blocked:
        first = min(blocked, key=lambda r: r["blocked_seq"])
        seq, op = first["blocked_seq"], first["blocked_op"]
        collective = {"op": op, "seq": seq}
        waiting = sorted(r["rank"] for r in blocked if r["blocked_seq"] == seq)
        stuck = [r for r in ranks if r["entered_seq"] < seq]
    in_collective = {r: op for r, op in (stack_ops or {}).items() if op}
    outside = [
        r for r in ranks if r["rank"] in (stack_ops or {}) and r["rank"] not in in_collective
    ]
    if collective is None and in_collective and outside:
        ops = sorted(in_collective.values())
        collective = {"op": max(ops, key=ops.count), "seq": None, "from": "stacks"}
        waiting = sorted(in_collective)
        stuck = outside
    if not stuck and ranks:
        earliest = min(r["moved_unix"] for r in ranks)
        early = [r for r in ranks if r["moved_unix"] <= earliest + SAME_STOP_S]
        stuck = [r for r in early if r["rank"] not in waiting] or early
    stuck_ranks = sorted(r["rank"] for r in stuck)
    return {
        "stuck_ranks": stuck_ranks,
        "stuck_hosts": sorted({r["host"] for r in stuck}),
        "waiting_ranks": [r for r in waiting if r not in stuck_ranks],
        "collective": collective,
        "stuck_for_s": round(max((r["idle_s"] for r in stuck), default=0.0), 1),
        "step": min((r["step"] for r in stuck), default=-1),
        "hosts_by_rank": {str(r["rank"]): r["host"] for r in ranks},
    }


def one_line(summary: dict[str, Any], directory: Path) -> str:
    """`hang: ranks 5,13 on node n2 stuck in all_gather #8812 for 612 s; dumps in DIR`."""
    ranks = summary["stuck_ranks"]
    hosts = summary["stuck_hosts"]
    who = f"rank{'s' if len(ranks) != 1 else ''} {','.join(map(str, ranks)) or '?'}"
    where = f"node{'s' if len(hosts) != 1 else ''} {','.join(hosts) or '?'}"
    c = summary["collective"]
    # "stuck in X #n": the collective the others wait in, which these ranks did not reach
    if c and c["seq"] is None:  # from the stacks: the others wait in it, these never came
        waiting = ",".join(map(str, summary["waiting_ranks"]))
        what = (
            f"outside collectives at step {summary['step']} while ranks {waiting} wait in "
            f"{c['op']} (their stacks)"
        )
    elif c:
        what = f"in {c['op']} #{c['seq']}"
    else:
        what = f"outside collectives at step {summary['step']}"
    return f"hang: {who} on {where} stuck {what} for {summary['stuck_for_s']:.0f} s; dumps in {directory}"
