"""Which nodes a requeued job leaves out: the decision, as a pure function (no Slurm, no I/O).

Every path that requeues a job calls `decide` with what it found against nodes (the bad-node
evidence of `toolkit.executors.badnodes`), the job's current exclude list (its ExcNodeList
and `cluster.exclude`), the partition's usable nodes and the job's node count. The answer is
the new exclude list, the nodes newly left out (with why), and whether the job can still be
scheduled: excluding so many that fewer usable nodes remain than the job needs would leave
it pending forever, so then the answer is to stop, with a one-line message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.distributed.env import expand_nodelist


@dataclass(frozen=True)
class BadNode:
    """Evidence that a node failed (or slowed) one attempt of the job."""

    node: str
    reason: str  # e.g. "NODE_FAIL", "hardware error: uncorrectable ECC", "hang: stuck host"
    attempt: int  # the job attempt (Slurm restart count) it happened in
    source: str = ""  # slurm | rank | telemetry | hang | straggler


@dataclass(frozen=True)
class Decision:
    exclude: list[str]  # the job's whole exclude list after this decision (sorted)
    added: list[BadNode]  # nodes newly left out, one entry per node (the first reason)
    schedulable: bool  # enough usable nodes remain: requeue; False: stop
    message: str  # one line: what was decided and why
    ignored: list[BadNode] = field(default_factory=list)  # evidence not acted on (and why)


def hostnames(spec: str | None) -> list[str]:
    """'n[1-3],gpu7' -> ['n1', 'n2', 'n3', 'gpu7']; None, '' or '(null)' -> []."""
    if not spec or spec.strip() in ("(null)", "None", "none"):
        return []
    return expand_nodelist(spec.strip())


def decide(
    bad: list[BadNode],
    excluded: list[str],
    usable: list[str] | None,
    job_nodes: int,
    enabled: bool = True,
) -> Decision:
    """The exclude list for the next attempt.

    bad: the evidence (several entries for one node keep the first reason).
    excluded: nodes the job already leaves out (ExcNodeList, cluster.exclude).
    usable: the partition's nodes that can run jobs now (not down, drained or failed);
        None when Slurm could not say (the exclusion is then not held back by a count).
    job_nodes: how many nodes the job asks for.
    enabled: fault.exclude_nodes; False keeps the exclude list as it is.
    """
    current = sorted(set(excluded))
    first: dict[str, BadNode] = {}
    for b in bad:
        first.setdefault(b.node, b)
    new = [b for n, b in sorted(first.items()) if n not in current]
    if not new:
        return Decision(current, [], True, "no bad node to exclude")
    names = ", ".join(f"{b.node} ({b.reason})" for b in new)
    if not enabled:
        return Decision(
            current, [], True, f"fault.exclude_nodes=false: not excluding {names}", ignored=new
        )
    proposed = sorted(set(current) | {b.node for b in new})
    left = sorted(set(usable or ()) - set(proposed))
    if usable is not None and len(left) < job_nodes:
        where = ", ".join(left) if left else "none"
        return Decision(
            current,
            [],
            False,
            f"excluding {names} would leave {len(left)} usable node(s) ({where}) for a "
            f"{job_nodes}-node job; not requeueing: it could never be scheduled",
            ignored=new,
        )
    return Decision(proposed, new, True, f"excluding {names}; exclude list {','.join(proposed)}")
