"""The node agent's spec: everything the first rank of a node tells the agent it starts.

One typed record crosses the process boundary, written by `to_json` on the rank side
(toolkit.telemetry.sink) and read by `from_json` in the agent (toolkit.telemetry.agent): the
two sides cannot drift apart, and the telemetry config is validated once, when it is read.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from toolkit.config.telemetry import TelemetryConfig


@dataclass
class WatchdogSpec:
    """The hang watchdog's settings (fault.hang_*; requeue from checkpoint.*)."""

    timeout_s: float | None = None  # None: max(300 s, 10 x median step time)
    startup_timeout_s: float = 1800.0
    requeue: bool = False  # requeue the Slurm job after a hang (checkpoint.requeue)
    max_restarts: int = 0  # checkpoint.max_restarts
    slurm_job_id: str | None = None  # the job to requeue; None: not under Slurm
    # Leaving the stuck node out at that requeue (toolkit.executors.slurm_exclude.JobShape):
    nodes: int = 1  # cluster.nodes
    exclude: str | None = None  # cluster.exclude
    partition: str | None = None  # cluster.partition
    exclude_nodes: bool = True  # fault.exclude_nodes
    # The module run (as its own process) after a hang's evidence is on disk, e.g. the
    # requeue: toolkit.executors.after_hang. None: the job just ends.
    after_hang_module: str | None = None


@dataclass
class AgentSpec:
    run_dir: str
    node: str
    attempt: int  # the job attempt (Slurm restart count)
    job_id: str | None
    node_rank: int
    ranks: list[int]  # the global ranks on this node
    world_size: int
    num_nodes: int
    socket: str  # where the ranks send their records
    parent_pid: int  # the rank that started the agent; the agent stops when it is gone
    config: TelemetryConfig
    versions: dict[str, Any] = field(default_factory=dict)
    nccl_env: dict[str, str] = field(default_factory=dict)
    watchdog: WatchdogSpec | None = None  # None: no hang watchdog

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AgentSpec:
        """The spec from JSON; a missing or unknown field is a ValueError naming it."""
        raw = json.loads(text)
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"agent spec: unknown fields {unknown}")
        try:
            watchdog = raw.get("watchdog")
            return cls(
                **{
                    **raw,
                    "config": TelemetryConfig(**raw["config"]),
                    "watchdog": WatchdogSpec(**watchdog) if watchdog is not None else None,
                }
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"agent spec: {exc}") from None
