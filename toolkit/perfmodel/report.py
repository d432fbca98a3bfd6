"""Human-readable views of a Prediction (rich tables), optionally beside measured values."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from toolkit.perfmodel.model import TERMS, Prediction

GIB = 2**30


def fmt_bytes(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:,.2f} GiB"
    return f"{n / 2**20:,.1f} MiB"


def fmt_s(s: float) -> str:
    return f"{1000 * s:,.2f} ms" if s < 10 else f"{s:,.1f} s"


def prediction_rows(p: Prediction) -> list[tuple[str, str, str]]:
    """(quantity, predicted, key in a measured dict) rows; the key is '' when not measured."""
    t, m, c, f = p.time, p.memory, p.communication, p.flops
    rows = [("fits in memory", "yes" if p.fits else p.does_not_fit(), "")]
    rows += [
        ("step time", fmt_s(float(t["step_s"])), "step_time_s"),
        (
            f"  range (hardware uncertainty ±{100 * float(t['uncertainty']):.0f} %)",
            " – ".join(fmt_s(v) for v in p.step_range_s()),
            "",
        ),
        ("  forward+backward", fmt_s(float(t["forward_backward_s"])), "forward_backward_s"),
        ("  optimizer (+ clip, small all-reduces)", fmt_s(float(t["optimizer_s"])), "optimizer_s"),
        ("  data wait", fmt_s(float(t["data_wait_s"])), "data_wait_s"),
    ]
    rows += [(f"  {name} term", fmt_s(float(t[f"{name}_s"])), "") for name in TERMS]
    rows += [
        ("  communication, all calls", fmt_s(float(t["communication_total_s"])), ""),
        ("dominant term", p.dominant, "dominant"),
        ("tokens/s (all ranks)", f"{p.tokens_per_s:,.0f}", "tokens_per_s"),
        ("model FLOPs / step", f"{f['model_flops_per_step']:.3e}", ""),
        ("FLOPs / rank (executed)", f"{f['executed_flops_per_rank']:.3e}", ""),
        ("memory / rank (peak)", fmt_bytes(m["peak_bytes"]), "peak_memory_growth_bytes"),
        ("  params + grads + optimizer states", fmt_bytes(m["state_bytes"]), ""),
        (
            "  params + optimizer states (after step 1)",
            fmt_bytes(m["params_bytes"] + m["optimizer_bytes"]),
            "persistent_bytes",
        ),
        ("  all-gather buffers", fmt_bytes(m["allgather_bytes"]), ""),
        ("  grad staging", fmt_bytes(m["staging_bytes"]), ""),
        ("  accumulated grads (grad_accum > 1)", fmt_bytes(m["accumulated_grads_bytes"]), ""),
        ("  activations", fmt_bytes(m["activations_bytes"]), ""),
        ("  logits / loss", fmt_bytes(m["logits_bytes"]), ""),
        ("  fused loss: grad_input + grad_weight", fmt_bytes(m["loss_held_bytes"]), ""),
        ("all-gather / rank", fmt_bytes(c["allgather_bytes"]), ""),
        ("reduce-scatter / rank", fmt_bytes(c["reduce_scatter_bytes"]), ""),
        ("replica all-reduce / rank", fmt_bytes(c["replica_allreduce_bytes"]), ""),
        ("tensor-parallel all-gather + reduce-scatter / rank", fmt_bytes(c["tp_bytes"]), ""),
        ("pipeline point-to-point / rank", fmt_bytes(c["p2p_bytes"]), ""),
        ("tensor-parallel link", tp_link(str(t["tp_link"])), ""),
        ("pipeline point-to-point link", str(t["pp_link"]), ""),
        ("pipeline bubble (of the step)", f"{100 * float(t['bubble_fraction']):.1f} %", ""),
        ("pipeline rank with the memory peak", str(m["stage"]), ""),
    ]
    return rows


def tp_link(link: str) -> str:
    if link == "inter-node":
        return "inter-node: the tp group spans nodes (slow; keep tp <= ranks per node)"
    return link


def format_measured(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "tokens_per_s":
        return f"{value:,.0f}"
    if key.endswith("_s"):
        return fmt_s(float(value))
    if key.endswith("_bytes"):
        return fmt_bytes(float(value))
    if isinstance(value, float):
        return f"{value:,.0f}"
    return str(value)


def prediction_table(
    p: Prediction, measured: dict[str, Any] | None = None, title: str = "performance model"
) -> Table:
    table = Table(title=title)
    table.add_column("quantity")
    table.add_column("predicted", justify="right")
    if measured is not None:
        table.add_column("measured", justify="right")
        table.add_column("measured/predicted", justify="right")
    for name, predicted, key in prediction_rows(p):
        if measured is None:
            table.add_row(name, predicted)
            continue
        value = measured.get(key) if key else None
        ratio = "-"
        pred_value = predicted_value(p, key)
        if isinstance(value, (int, float)) and pred_value:
            ratio = f"{value / pred_value:.2f}"
        table.add_row(name, predicted, format_measured(key, value), ratio)
    return table


def predicted_value(p: Prediction, key: str) -> float | None:
    """The predicted number a measured key compares with."""
    table: dict[str, float] = {
        "step_time_s": float(p.time["step_s"]),
        "forward_backward_s": float(p.time["forward_backward_s"]),
        "optimizer_s": float(p.time["optimizer_s"]),
        "tokens_per_s": p.tokens_per_s,
        "peak_memory_growth_bytes": p.memory["peak_bytes"],
        "persistent_bytes": p.memory["params_bytes"] + p.memory["optimizer_bytes"],
    }
    return table.get(key)


def split_table(summary: dict[str, Any], title: str = "per term: model vs measured") -> Table:
    """The step's split, predicted beside measured (a benchmark summary's split_* columns;
    toolkit.perfmodel.split maps the model's terms onto the measured parts)."""
    from toolkit.perfmodel.split import PARTS

    table = Table(title=title)
    for name, justify in (("term", "left"), ("predicted", "right"), ("measured", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("measured/predicted", justify="right")
    for part in PARTS:
        predicted = summary.get(f"split_predicted_{part}_s")
        measured = summary.get(f"split_measured_{part}_s")
        ratio = f"{measured / predicted:.2f}" if measured is not None and predicted else "-"
        table.add_row(
            part.replace("_", " "),
            "-" if predicted is None else fmt_s(predicted),
            "-" if measured is None else fmt_s(measured),
            ratio,
        )
    return table
