"""An ensemble's members in the report (trainer.ensemble=K; docs/ensembles.md): one row per
member (its name, seed, learning rate, final and validation loss, and the step it was
dropped at) and one plot of every member's loss against the step, a dropped member's line
ending in a cross where it dropped.

Read as plain JSON from RUN/members/<name>/ (member.json, summary.json and the member's
metrics/rank0.jsonl, the last attempt's record of each step): a value of the wrong type is
shown as absent, never an error. The plot file is members_loss.png, never named by anything
read from the run dir; at most MAX_LINES members are drawn (all of them are in the table)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.events import last_attempt, read_records
from toolkit.telemetry.report.figures import binned, figure

HEADER = ["member", "seed", "lr", "final loss", "val loss", "dropped at step"]
MAX_LINES = 64
PLOT_KEY = "members_loss_png"
PLOT_TITLE = "Loss per ensemble member"


def read_members(run_dir: Path) -> list[dict[str, Any]]:
    """One row per member folder that holds a member.json, in member-index order: name,
    index, seed, lr, final_loss, val_loss, dropped_at_step, steps (its recorded steps) and
    folder (its directory). [] for a run that is no ensemble."""
    folder = Path(run_dir) / "members"
    try:
        folders = sorted(p for p in folder.iterdir() if (p / "member.json").is_file())
    except OSError:
        return []
    rows = []
    for path in folders:
        member, summary = _object(path / "member.json"), _object(path / "summary.json")
        name = member.get("name")
        rows.append(
            {
                "name": name if isinstance(name, str) and name else path.name,
                "index": _int(member.get("index")),
                "seed": _int(member.get("seed")),
                "lr": _float(member.get("lr")),
                "final_loss": _float(summary.get("final_loss")),
                "val_loss": _float(summary.get("val_loss")),
                "dropped_at_step": _int(summary.get("dropped_at_step")),
                "steps": len(losses(path)),
                "folder": str(path),
            }
        )
    rows.sort(key=lambda r: (r["index"] is None, r["index"] or 0, r["name"]))
    return rows


def losses(member_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of the member's rank-0 records, the last attempt's of each step."""
    records = last_attempt(read_records(Path(member_dir) / "metrics" / "rank0.jsonl"))
    return [
        (int(r["step"]), float(r["loss"])) for r in records if _float(r.get("loss")) is not None
    ]


def rows(members: list[dict[str, Any]]) -> list[list[str]]:
    """The table's rows (HEADER), as text."""

    def text(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    return [
        [
            m["name"],
            text(m["seed"], "d"),
            text(m["lr"], ".3g"),
            text(m["final_loss"], ".4g"),
            text(m["val_loss"], ".4g"),
            text(m["dropped_at_step"], "d"),
        ]
        for m in members
    ]


def member_plots(members: list[dict[str, Any]], out: Path, max_points: int) -> dict[str, Path]:
    """{PLOT_KEY: png} with one line per member (at most MAX_LINES); {} when no member
    recorded a loss."""
    curves = [(m, losses(Path(m["folder"]))) for m in members[:MAX_LINES]]
    curves = [(m, points) for m, points in curves if points]
    if not curves:
        return {}
    plt, (fig, ax) = figure(figsize=(9, 4))
    for m, points in curves:
        steps, values = (np.array(v, dtype=float) for v in zip(*points, strict=True))
        x, y = binned(steps, values, max_points)
        dropped = m["dropped_at_step"]
        label = m["name"] if dropped is None else f"{m['name']} (dropped at step {dropped})"
        (line,) = ax.plot(x, y, "o-" if len(x) < 30 else "-", ms=3, lw=0.9, label=label)
        if dropped is not None:  # where it dropped: after its last finite loss
            ax.plot([dropped], [values[-1]], "x", ms=9, mew=2, color=line.get_color())
    ax.set_title(f"Loss per member ({len(members)} members)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=max(1, len(curves) // 12), loc="upper right")
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.9)
    path = out / "members_loss.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {PLOT_KEY: path}


def _object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(float(value)) else None
