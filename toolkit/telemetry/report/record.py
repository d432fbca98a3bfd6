"""The report as data: what the analysis found about a run, below every renderer (the HTML
page, its tables and plots read it; build.py fills it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolkit.telemetry.report.analysis import Attribution, IdleGap, Straggler
from toolkit.telemetry.report.gpustats import GpuStats
from toolkit.telemetry.report.verdict import Verdict


@dataclass
class Report:
    run_dir: Path
    out_dir: Path
    nodes: list[dict[str, Any]]
    ranks: list[dict[str, Any]]
    gpus: list[GpuStats]
    stragglers: list[Straggler]
    idle_gaps: list[IdleGap]
    attribution: Attribution
    events: list[dict[str, Any]]
    skipped: list[tuple[str, str]]
    sacct: dict[str, Any] | None = None
    sacct_note: str = ""
    absent: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    verdict: Verdict | None = None
    profiles: list[str] = field(default_factory=list)  # RUN_DIR/profiles/step<N>/rank<k>.json.gz
    scale: dict[str, Any] | None = None  # read through per-node summaries: how
    layout: dict[str, Any] = field(default_factory=dict)  # RUN_DIR/mesh.json: degrees, warnings
    unit: str = "tokens"  # the model's throughput unit (RUN/model.json): tokens | samples
    model: dict[str, Any] | None = None  # RUN/model.json as the run recorded it (None: none)
    custom_series: dict[str, str] = field(default_factory=dict)  # your series -> its plot
    members: list[dict[str, Any]] = field(default_factory=list)  # an ensemble's (members.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "nodes": self.nodes,
            "ranks": self.ranks,
            "gpus": [asdict(g) for g in self.gpus],
            "stragglers": [asdict(s) for s in self.stragglers],
            "idle_gaps": [asdict(g) | {"duration_s": g.duration_s} for g in self.idle_gaps],
            "attribution_s": self.attribution.seconds,
            "attribution_share": self.attribution.shares(),
            "skipped": [{"file": p, "reason": why} for p, why in self.skipped],
            "sacct": self.sacct,
            "sacct_note": self.sacct_note,
            "absent": self.absent,
            "outputs": self.outputs,
            "num_events": len(self.events),
            "verdict": self.verdict.to_json() if self.verdict is not None else None,
            "profiles": self.profiles,
            **({"scale": self.scale} if self.scale is not None else {}),
            "layout": self.layout,
            "unit": self.unit,
            "model": self.model,
            "custom_series": self.custom_series,
            "members": self.members,
        }
