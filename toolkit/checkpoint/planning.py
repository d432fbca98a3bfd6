"""Reusing a save's plan for the next save of the same state.

Before writing, every DCP save plans: each rank lists its write items (one per tensor
shard), rank 0 gathers every rank's list, deduplicates it, builds the checkpoint's metadata
and scatters each rank's final plan back. That is Python on the save's background thread,
which takes the GIL from the training thread; unpickling the gathered plans also creates
enough objects to set off the garbage collector's full collections (what reusing the plans
saves: see docs/BENCHMARKS.md, Issue 4).

DCP can reuse them (`enable_plan_caching`): a rank whose plan equals its previous one sends
an empty plan, and rank 0 reuses its cached global plan and metadata. A state whose structure
changed (a new tensor, another shape or dtype) is planned afresh. DCP keeps the cache in
class-level dicts under a key per planner class, shared by the whole process; `PlanCache`
gives each checkpointer a key of its own, so that two checkpointers in one process never
reuse each other's plans, and drops its entries when the checkpointer closes.
"""

from __future__ import annotations

import uuid

from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlanner

from toolkit.checkpoint import compat

# SavePlanner's class-level caches (torch >= 2.7), each keyed by `_cached_plans_key`.
_CACHES = (
    "_cached_save_plan",
    "_cached_final_save_plan",
    "_cached_all_plans",
    "_cached_global_plan",
    "_cached_metadata",
)


class PlanCache:
    """Save planners that share one plan cache, private to their owner."""

    def __init__(self) -> None:
        self.key = f"toolkit-{uuid.uuid4().hex}"
        self.supported = compat.plan_caching(_CACHES)  # private to DCP: falls back to none

    def planner(self) -> SavePlanner:
        """DCP's default save planner, reusing this cache's plans where torch can."""
        if not self.supported:
            return DefaultSavePlanner()
        planner = DefaultSavePlanner(enable_plan_caching=True)
        planner._cached_plans_key = self.key
        return planner

    def clear(self) -> None:
        """Forget this cache's plans (DCP would keep them for the life of the process)."""
        for name in _CACHES:
            getattr(SavePlanner, name, {}).pop(self.key, None)
