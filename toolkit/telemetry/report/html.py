"""A self-contained HTML report: tables and the PNG plots embedded as base64."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.telemetry.report import tables

if TYPE_CHECKING:
    from toolkit.telemetry.report.record import Report

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
.note{color:#777;font-size:12px}
"""


PLOTS = (
    ("training_png", "Loss, grad norm and learning rate"),
    ("step_time_png", "Step time per rank"),
    ("throughput_png", "Throughput"),
    ("host_png", "Host CPU, memory, disk and network per node"),
    ("gpu_curves_png", "GPU utilisation, memory, power and clocks per node"),
    ("gpu_heatmap_png", "GPU utilization and power"),
)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_html(report: Report, images: dict[str, Path], path: Path) -> Path:
    parts = [f"<h1>Telemetry report</h1><p class=note>{html.escape(str(report.run_dir))}</p>"]
    parts.append(f"<p>{html.escape(tables.throughput_line(report))}</p>")
    if report.verdict is not None:
        from toolkit.telemetry.report.verdict import summary_lines

        lines = summary_lines(report.verdict)
        parts.append(
            "<h2 id=diagnosis>Diagnosis</h2><ul>"
            + "".join(f"<li>{html.escape(line)}</li>" for line in lines)
            + "</ul>"
        )
    if report.profiles:
        links = "".join(
            f'<li><a href="{html.escape(Path(p).resolve().as_uri())}">{html.escape(p)}</a></li>'
            for p in report.profiles
        )
        merged = (
            "Merged with the telemetry timeline in trace.json (ui.perfetto.dev)."
            if "trace" in report.outputs
            else "No trace.json: a long run read through per-node summaries (--stream off)."
        )
        parts.append(
            "<h2 id=profiles>Profiler windows</h2><ul>" + links + f"</ul><p class=note>{merged}</p>"
        )
    if report.scale is not None:
        parts.append(
            f"<p class=note>Read through per-node summaries: steps in chunks of "
            f"{report.scale['chunk_steps']}; stragglers scored per chunk "
            f"({report.scale['summaries_cached']} summaries cached, "
            f"{report.scale['summaries_computed']} computed).</p>"
        )
    parts.append(
        "<h2>Nodes</h2>"
        + _table(tables.header(tables.node_columns(report)), tables.node_rows(report))
    )
    parts.append("<h2>Stragglers</h2>")
    parts.append(
        _table(tables.STRAGGLER_HEADER, tables.straggler_rows(report))
        if report.stragglers
        else "<p>None found.</p>"
    )
    parts.append("<h2>Idle gaps</h2>")
    parts.append(
        _table(tables.GAP_HEADER, tables.gap_rows(report))
        if report.idle_gaps
        else "<p>None found.</p>"
    )
    parts.append(
        "<h2>Where the time went</h2>"
        + _table(tables.ATTRIBUTION_HEADER, tables.attribution_rows(report))
    )
    for key, title in PLOTS:
        if key in images:
            parts.append(f"<h2 id={key}>{title}</h2>" + _image(images[key], title))
    if report.custom_series:  # a callback's metrics, session.log's other names, eval metrics
        parts.append("<h2 id=custom_series>Your series</h2>")
        for name, png in report.custom_series.items():
            parts.append(f"<h3>{html.escape(name)}</h3>" + _image(Path(png), name))
    if report.members:  # an ensemble's (trainer.ensemble=K): one row per member
        from toolkit.telemetry.report.members import HEADER, PLOT_KEY, PLOT_TITLE, rows

        parts.append("<h2 id=members>Ensemble members</h2>" + _table(HEADER, rows(report.members)))
        if PLOT_KEY in images:
            parts.append(_image(images[PLOT_KEY], PLOT_TITLE))
    parts.append(
        "<h2>Ranks</h2>"
        + _table(tables.header(tables.rank_columns(report)), tables.rank_rows(report))
    )
    notes = [f"{g}: absent: {why}" for g, why in report.absent.items()]
    notes += [f"skipped {p}: {why}" for p, why in report.skipped]
    notes.append(report.sacct_note)
    if report.sacct:
        notes += [
            f"slurm job {j['job_id']}: {j['state']}, elapsed {j['elapsed_s']} s, "
            f"requeues {j['requeues']}, nodes {j['nodes']}"
            for j in report.sacct["jobs"]
        ]
    parts.append(
        "<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
    )
    parts.append(f"<p class=note>report built in {report.elapsed_s:.2f} s</p>")
    path.write_text(
        f"<!doctype html><html><head><meta charset=utf-8><title>Telemetry report</title>"
        f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>"
    )
    return path
