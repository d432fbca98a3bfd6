"""Evidence that a node failed a job attempt, from the run dir, and the record of exclusions.

Sources (Slurm's NODE_FAIL is read by `toolkit.executors.slurm_exclude`, which asks Slurm):
- marks in RUN_DIR/bad_nodes.jsonl: a rank that died with a hardware-like error (see
  HARDWARE_ERROR), a node the live straggler score marked with
  fault.straggler_action=exclude_on_requeue;
- the newest hang summary of the attempt (RUN_DIR/hangs/<UTC time>/summary.json), when its
  `stuck_hosts` names exactly one node (stuck ranks spread over several nodes point at the
  program, not a node);
- telemetry of the attempt: XID events and a rising uncorrectable ECC count of a node's GPUs.

RUN_DIR/excluded_nodes.json (0600) lists every node left out so far: node, reason, attempt,
time, source, and the job's exclude list. Only JSON is read back; files of the job are its
user's alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from toolkit.executors.exclusion import BadNode, Decision

log = logging.getLogger(__name__)

MARKS = "bad_nodes.jsonl"
RECORD = "excluded_nodes.json"
# A rank's error text that blames its node's hardware, not the program: narrow on purpose
# (a CUDA out-of-memory or a NCCL timeout is no reason to leave a node out).
HARDWARE_ERROR = re.compile(
    r"uncorrectable ECC|ECC error|\bXid\b|GPU has fallen off the bus|fault\.fail_node",
    re.IGNORECASE,
)


def node_name() -> str:
    """This process's node: Slurm's name for it (SLURMD_NODENAME), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _append_private(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def mark(run_dir: Path, bad: BadNode) -> None:
    """Record evidence against a node (any rank may call it; one short append each)."""
    record = {
        "node": bad.node,
        "reason": bad.reason,
        "attempt": bad.attempt,
        "source": bad.source,
        "time": time.time(),
    }
    _append_private(Path(run_dir) / MARKS, json.dumps(record) + "\n")


def marks(run_dir: Path, attempt: int) -> list[BadNode]:
    """The marks of one attempt (unreadable lines are skipped)."""
    path = Path(run_dir) / MARKS
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
            if int(rec["attempt"]) == attempt:
                out.append(BadNode(str(rec["node"]), str(rec["reason"]), attempt, rec["source"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def note_rank_failure(run_dir: Path, text: str, attempt: int) -> BadNode | None:
    """A rank failed with `text` (its traceback): mark its node when the text is a
    hardware error. Returns the mark, or None."""
    found = HARDWARE_ERROR.search(text)
    if found is None:
        return None
    bad = BadNode(node_name(), f"hardware error: {found.group(0)}", attempt, "rank")
    try:
        mark(run_dir, bad)
    except OSError as exc:
        log.warning("could not mark node %s as bad: %s", bad.node, exc)
        return None
    return bad


def hang_hosts(run_dir: Path, attempt: int, since: float | None = None) -> list[BadNode]:
    """The node the newest hang summary (written at or after `since`) names as stuck, when
    it names exactly one."""
    summaries = sorted(Path(run_dir).glob("hangs/*/summary.json"))
    for path in reversed(summaries):
        try:
            if since is not None and path.stat().st_mtime < since:
                return []
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        hosts = sorted({str(h) for h in summary.get("stuck_hosts") or []})
        if len(hosts) != 1:
            log.info("hang summary %s names %d stuck hosts: no node to blame", path, len(hosts))
            return []
        ranks = ",".join(str(r) for r in summary.get("stuck_ranks") or [])
        collective = summary.get("collective") or {}
        where = f" in {collective.get('op')} #{collective.get('seq')}" if collective else ""
        reason = f"hang: ranks {ranks} stuck{where}"
        return [BadNode(hosts[0], reason, attempt, "hang")]
    return []


def telemetry_nodes(run_dir: Path, attempt: int) -> list[BadNode]:
    """Nodes whose telemetry of this attempt recorded an XID error or new uncorrectable ECC
    errors. Unreadable node files (an agent still writing) are skipped."""
    try:
        from toolkit.telemetry.read import load_node, node_files
        from toolkit.telemetry.schema import XID
    except ImportError:  # telemetry's dependencies (h5py) absent: nothing recorded either
        return []
    out = []
    for path in node_files(Path(run_dir)):
        try:
            data = load_node(path)
        except Exception as exc:  # noqa: BLE001 - a file being written or damaged: skip it
            log.debug("skipping %s: %s", path, exc)
            continue
        try:
            if data.attempt != attempt:
                continue
            xids = sorted({str(e["attrs"].get("xid")) for e in data.events if e["name"] == XID})
            if xids:
                out.append(BadNode(data.node, f"XID {','.join(xids)}", attempt, "telemetry"))
                continue
            for gpu, table in data.gpus.items():
                counts = _column(table, "ecc_uncorrected_volatile")
                if counts is not None and len(counts) and counts.max() > counts[0]:
                    reason = f"uncorrectable ECC errors on GPU {gpu}"
                    out.append(BadNode(data.node, reason, attempt, "telemetry"))
                    break
        finally:
            data.close()
    return out


def _column(table: Any, name: str) -> Any:
    try:
        return table[name]
    except (KeyError, ValueError):
        return None


def excluded(run_dir: Path) -> list[dict[str, Any]]:
    """The entries of RUN_DIR/excluded_nodes.json ([] when there is none)."""
    try:
        return list(json.loads((Path(run_dir) / RECORD).read_text())["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def record(run_dir: Path, decision: Decision, job_id: str | None) -> None:
    """Add the decision's newly excluded nodes to RUN_DIR/excluded_nodes.json (0600)."""
    path = Path(run_dir) / RECORD
    entries = excluded(run_dir)
    now = time.time()
    known = {e.get("node") for e in entries}
    for b in decision.added:
        if b.node not in known:
            entries.append(
                {
                    "node": b.node,
                    "reason": b.reason,
                    "attempt": b.attempt,
                    "source": b.source,
                    "time": now,
                    "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                }
            )
    doc = {"job_id": job_id, "exclude": decision.exclude, "nodes": entries}
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
