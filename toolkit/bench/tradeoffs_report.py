"""The trade-off matrix's outputs (toolkit.bench.tradeoffs): the markdown table and the plot
(loss curves, loss minus the fp32 reference, step time against peak memory growth)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.bench.tradeoffs import PREDICTED, REFERENCE


def cell(row: dict[str, Any], key: str, fmt: str, scale: float = 1.0) -> str:
    value = row.get(key)
    return "—" if value is None else format(value * scale, fmt)


def table(rows: list[dict[str, Any]], prices: dict[str, float]) -> str:
    priced = sorted({k for r in rows for k in r if k.startswith(PREDICTED)})
    head = (
        "| model | setting | runs | step ms (median) | peak MiB (growth) | predicted peak MiB "
        "| val loss | max / final |Δloss| vs fp32 "
        "| bitwise repeat | tokens/s | $/Mtok measured"
        + "".join(f" | $/Mtok predicted {k.removeprefix(PREDICTED)}" for k in priced)
        + " |"
    )
    lines = [head, "|" + "---|" * (11 + len(priced))]
    for r in rows:
        if r["status"] != "ran":
            lines.append(f"| {r['model']} | {r['setting']} | {r['status']}: {r['reason']} |")
            continue
        repeat = "—"
        if "bitwise_reproducible" in r:
            repeat = (
                "identical"
                if r["bitwise_reproducible"]
                else (f"differs (max {r['repeat_max_abs_delta_loss']:.2e})")
            )
        lines.append(
            f"| {r['model']} | {r['setting']} | {r['runs']} "
            f"| {cell(r, 'step_time_s_median', ',.1f', 1e3)} "
            f"| {cell(r, 'peak_memory_bytes', ',.1f', 2**-20)} "
            f"({cell(r, 'peak_memory_growth_bytes', ',.1f', 2**-20)}) "
            f"| {cell(r, 'predicted_peak_memory_bytes', ',.1f', 2**-20)} "
            f"| {cell(r, 'val_loss', '.4f')} "
            f"| {cell(r, 'max_abs_delta_loss', '.2e')} / {cell(r, 'final_abs_delta_loss', '.2e')} "
            f"| {repeat} | {cell(r, 'tokens_per_s', ',.0f')} "
            f"| {cell(r, 'cost_per_mtok_measured', ',.4f')}"
            + "".join(f" | {cell(r, k, ',.4f')}" for k in priced)
            + " |"
        )
    return "\n".join(lines)


def memory_mib(row: dict[str, Any]) -> float:
    growth = row.get("peak_memory_growth_bytes")
    return (growth if growth is not None else row["peak_memory_bytes"]) / 2**20


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Loss per step (left), its difference from the model's fp32 reference (middle: the
    curves overlap at the left's scale) and step time against peak memory growth (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r["status"] == "ran"]
    references = {r["model"]: r["losses"] for r in ran if r["setting"] == REFERENCE}
    fig, (curves, deltas, scatter) = plt.subplots(1, 3, figsize=(18, 5))
    for r in ran:
        label = f"{r['model']} {r['setting']}"
        steps = range(len(r["losses"]))
        curves.plot(steps, r["losses"], label=label, linewidth=1)
        if r["model"] in references:
            diff = [a - b for a, b in zip(r["losses"], references[r["model"]], strict=True)]
            deltas.plot(steps, diff, label=label, linewidth=1)
        point = (memory_mib(r), r["step_time_s_median"] * 1e3)
        scatter.scatter(*point)
        scatter.annotate(label, point, fontsize=7)
    curves.set(xlabel="step", ylabel="training loss", title="loss per step")
    curves.legend(fontsize=7)
    deltas.set(xlabel="step", ylabel="loss - fp32 reference", title=f"vs {REFERENCE}")
    scatter.set(xlabel="peak memory growth (MiB)", ylabel="step time, median (ms)", title="cost")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
