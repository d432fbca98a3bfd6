"""Sweep comparison: a rich table and PNG plots over the results of several runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from toolkit.measure.stats import scaling_efficiency

WORLD_KEYS = ("cluster.tasks_per_node", "cluster.nodes", "cluster.gpus_per_node")


def label(summary: dict[str, Any]) -> str:
    """What distinguishes a run in a sweep: its overrides minus the ones every run shares."""
    return " ".join(summary.get("varying", summary["overrides"])) or summary["run_dir"]


def mark_varying(summaries: list[dict[str, Any]]) -> None:
    """Add 'varying': the overrides not common to every run of the sweep."""
    common = set.intersection(*(set(s["overrides"]) for s in summaries)) if summaries else set()
    for s in summaries:
        s["varying"] = [o for o in s["overrides"] if o not in common]


def add_scaling_efficiency(summaries: list[dict[str, Any]]) -> None:
    """'scaling_efficiency' for runs that differ only in world size (None when a run has no
    smaller-world partner in the sweep)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for s in summaries:
        key = tuple(o for o in s["overrides"] if not o.startswith(WORLD_KEYS))
        groups.setdefault(key, []).append(s)
    for runs in groups.values():
        worlds = {r["world_size"] for r in runs}
        eff = scaling_efficiency([(r["world_size"], r["tokens_per_s"]) for r in runs])
        for r in runs:
            r["scaling_efficiency"] = eff[r["world_size"]] if len(worlds) > 1 else None


def comparison_table(summaries: list[dict[str, Any]], title: str = "benchmark sweep") -> Table:
    table = Table(title=title)
    for name in (
        "run",
        "ranks",
        "step ms",
        "p10-p90 ms",
        "tok/s",
        "tok/s/dev",
        "MFU",
        "peak mem",
        "data wait",
        "pred. ms",
        "meas/pred",
        "scaling eff.",
    ):
        table.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for s in summaries:
        eff = s.get("scaling_efficiency")
        table.add_row(
            label(s),
            str(s["world_size"]),
            f"{1000 * s['step_time_s_median']:.1f}",
            f"{1000 * s['step_time_s_p10']:.1f}-{1000 * s['step_time_s_p90']:.1f}",
            f"{s['tokens_per_s']:,.0f}",
            f"{s['tokens_per_s_per_device']:,.0f}",
            f"{100 * s['mfu']:.2f}%",
            f"{s['peak_memory_bytes'] / 2**20:,.0f} MiB",
            f"{100 * s['data_wait_share']:.1f}%",
            f"{1000 * s['predicted_step_s']:.1f}",
            f"{s['step_time_ratio']:.2f}",
            "-" if eff is None else f"{100 * eff:.0f}%",
        )
    return table


def plot(summaries: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """comparison.png (throughput and step time per run, measured vs predicted) and, when
    the sweep varies the world size, scaling.png (efficiency vs ranks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    labels = [label(s) for s in summaries]
    x = range(len(summaries))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(summaries) + 4), 4.5))
    ax1.bar(x, [s["tokens_per_s"] for s in summaries], label="measured")
    ax1.plot(x, [s["predicted_tokens_per_s"] for s in summaries], "k_", ms=20, label="model")
    ax1.set_ylabel("tokens/s (all ranks)")
    ax1.set_yscale("log")
    ax1.legend()
    med = [1000 * s["step_time_s_median"] for s in summaries]
    lo = [m - 1000 * s["step_time_s_p10"] for m, s in zip(med, summaries, strict=True)]
    hi = [1000 * s["step_time_s_p90"] - m for m, s in zip(med, summaries, strict=True)]
    ax2.errorbar(x, med, yerr=[lo, hi], fmt="o", capsize=4, label="measured (p10-p90)")
    ax2.plot(x, [1000 * s["predicted_step_s"] for s in summaries], "k_", ms=20, label="model")
    ax2.set_ylabel("step time (ms)")
    ax2.set_yscale("log")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    paths = [out_dir / "comparison.png"]
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)
    scaled = [s for s in summaries if s.get("scaling_efficiency") is not None]
    if scaled:
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.plot([s["world_size"] for s in scaled], [s["scaling_efficiency"] for s in scaled], "o")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("ranks")
        ax.set_ylabel("scaling efficiency")
        ax.set_ylim(0, 1.2)
        fig.tight_layout()
        paths.append(out_dir / "scaling.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths
