"""Assemble the report: load every node file of a run, analyse, write the outputs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.config.telemetry import ReportConfig
from toolkit.runmodel import run_unit
from toolkit.telemetry.read import RunData, load_run, node_files
from toolkit.telemetry.report import analysis, export, members, model
from toolkit.telemetry.report.analysis import Attribution
from toolkit.telemetry.report.gpustats import GpuStats, gpu_stats
from toolkit.telemetry.report.record import Report
from toolkit.telemetry.report.scaled import Scaled, load_scaled
from toolkit.telemetry.report.verdict import Verdict, diagnose, unmeasured_why


def read_layout(run_dir: Path) -> dict[str, Any]:
    """The run's parallel layout (RUN_DIR/mesh.json, written at start): degrees, a one-line
    description and placement warnings; {} for runs without one."""
    try:
        record = json.loads((Path(run_dir) / "mesh.json").read_text())
    except (OSError, ValueError):
        return {}
    keys = ("degrees", "describe", "warnings")
    return {k: record[k] for k in keys if k in record} if isinstance(record, dict) else {}


def _gpu_of_rank(run: RunData, rank: int, node: str) -> tuple[str, int] | None:
    """The GPU a rank drove: its position among its node's ranks (one GPU per rank)."""
    for n in reversed(run.nodes):
        if n.node == node and rank in n.ranks:
            local = n.ranks.index(rank)
            return (node, local) if local in n.gpus else None
    return None


def analyse(
    run: RunData, cfg: ReportConfig, scaled: Scaled | None = None
) -> tuple[Report, dict[int, analysis.RankSeries]]:
    """The report's analysis; with `scaled` (a long run read through per-node summaries)
    the series are step chunks and the exact figures come from the summaries."""
    if scaled is None:
        series = analysis.collect_steps(run, cfg.skip_first_steps)
        gpus = [g for n in run.nodes for g in gpu_stats(n)]
    else:
        series, gpus = scaled.series, scaled.gpus
    events = sorted((e for n in run.nodes for e in n.events), key=lambda e: e["start"])
    # A GPU seen in several attempts: merge its stats (sum of throttle, mean of the rest).
    by_gpu: dict[tuple[str, int], list[GpuStats]] = {}
    for g in gpus:
        by_gpu.setdefault((g.node, g.index), []).append(g)
    gpu_rows = [
        GpuStats(
            node=k[0],
            index=k[1],
            mean_util_pct=float(np.nanmean([g.mean_util_pct for g in v])),
            mean_power_w=float(np.nanmean([g.mean_power_w for g in v])),
            throttle_s=float(sum(g.throttle_s for g in v)),
            max_temp_c=float(np.nanmax([g.max_temp_c for g in v])),
            energy_j=float(np.nansum([g.energy_j for g in v])),
        )
        for k, v in sorted(by_gpu.items())
    ]
    gpu_index = {(g.node, g.index): g for g in gpu_rows}
    scores = analysis.straggler_scores(series, cfg.straggler_metric) if series else {}
    rank_rows = []
    for r, s in series.items():
        row: dict[str, Any] = {"node": s.node, "rank": r}
        row["attempts"] = sorted(int(a) for a in np.unique(s.attempt))
        row.update(analysis.rank_stats(s) if scaled is None else scaled.rank_stats[r])
        gpu = gpu_index.get(_gpu_of_rank(run, r, s.node) or ("", -1))
        row["gpu_util_pct"] = gpu.mean_util_pct if gpu else None
        row["power_w"] = gpu.mean_power_w if gpu else None
        row["throttle_s"] = gpu.throttle_s if gpu else None
        row["straggler_score"] = scores.get(r, 0.0)
        rank_rows.append(row)
    node_rows = []
    for name in sorted({n.node for n in run.nodes}):
        mine = [row for row in rank_rows if row["node"] == name]
        node_gpus = [g for g in gpu_rows if g.node == name]
        ib_rates = [
            float(np.nanmean(t["xmit_bytes_per_s"]))
            for n in run.nodes
            if n.node == name
            for t in n.ib.values()
            if "xmit_bytes_per_s" in t and len(t)
        ]
        node_rows.append(
            {
                "node": name,
                "attempts": sorted({n.attempt for n in run.nodes if n.node == name}),
                "ranks": len(mine),
                "gpus": len(node_gpus),
                "median_step_s": analysis.median_or_nan([r["median_step_s"] for r in mine]),
                "p99_step_s": max((r["p99_step_s"] for r in mine), default=float("nan")),
                "median_tokens_per_s": analysis.median_or_nan(
                    [r["median_tokens_per_s"] for r in mine]
                ),
                "median_samples_per_s": analysis.median_or_nan(
                    [r["median_samples_per_s"] for r in mine]
                ),
                "median_mfu": analysis.median_or_nan([r["median_mfu"] for r in mine]),
                "data_wait_share": analysis.median_or_nan([r["data_wait_share"] for r in mine]),
                "gpu_util_pct": float(np.mean([g.mean_util_pct for g in node_gpus]))
                if node_gpus
                else None,
                "power_w": float(np.sum([g.mean_power_w for g in node_gpus]))
                if node_gpus
                else None,
                "throttle_s": float(sum(g.throttle_s for g in node_gpus)) if node_gpus else None,
                "ib_xmit_bytes_per_s": float(np.sum(ib_rates)) if ib_rates else None,
                "straggler_score": analysis.median_or_nan([r["straggler_score"] for r in mine]),
            }
        )
    absent: dict[str, str] = {}
    for n in run.nodes:
        for group, why in n.absent().items():
            absent.setdefault(group, f"{why} (e.g. {n.node})")
    report = Report(
        run_dir=run.run_dir,
        out_dir=run.run_dir,
        nodes=node_rows,
        ranks=rank_rows,
        gpus=gpu_rows,
        stragglers=analysis.find_stragglers(series, cfg) if series else [],
        idle_gaps=[],
        attribution=Attribution(),
        events=events,
        skipped=[(str(p), why) for p, why in run.skipped],
        absent=absent,
    )
    if scaled is not None:
        report.idle_gaps, report.attribution = scaled.idle_gaps, scaled.attribution
    elif series:
        report.idle_gaps = analysis.find_idle_gaps(series, events, cfg)
        report.attribution = analysis.attribute_time(series, events)
    report.verdict = _diagnose(run, series, report, cfg, scaled.terms if scaled else None)
    if not report.verdict.measured:
        report.verdict.unmeasured_why = unmeasured_why(report.absent) or (
            # Steps arrived, with no split of their time: a script's session.log logged none.
            "the step records carry no split of the step time into data wait, compute, "
            "communication and optimizer (a script logs only what it measures)"
            if any(len(s) for s in series.values())
            else ""
        )
    report.layout = read_layout(run.run_dir)
    report.unit = run_unit(run.run_dir)  # RUN/model.json: tokens/s or samples/s
    report.members = members.read_members(run.run_dir)  # an ensemble's: RUN/members/<name>/
    report.profiles = [str(p) for p in export.profile_files(run.run_dir)]
    return report, series


def _diagnose(
    run: RunData,
    series: dict[int, analysis.RankSeries],
    report: Report,
    cfg: ReportConfig,
    terms: dict[str, float] | None = None,
) -> Verdict:
    job = model.load_config(run.run_dir)
    world = max((int(n.attrs.get("world_size", 0) or 0) for n in run.nodes), default=0)
    recorded, no_model = model.load_model(run.run_dir)
    report.model = recorded.as_dict() if recorded is not None else None
    predicted, note = model.predicted_terms(job, world or len(series) or 1, recorded, no_model)
    return diagnose(
        series,
        report.attribution,
        report.idle_gaps,
        report.gpus,
        report.events,
        cfg,
        job,
        predicted,
        note,
        terms=terms,
    )


def streams(run_dir: Path, cfg: ReportConfig) -> bool:
    """Whether the report reads through per-node summaries (`--stream`; by default when
    the node files together exceed cfg.stream_above_mb)."""
    if cfg.stream != "auto":
        return cfg.stream == "on"
    files = node_files(run_dir) if run_dir.is_dir() else []
    return sum(p.stat().st_size for p in files) > cfg.stream_above_mb * 1e6


def build_report(run_dir: Path, out_dir: Path | None, cfg: ReportConfig) -> Report:
    """Load, analyse and write every output under out_dir (default RUN_DIR/telemetry/report)."""
    from toolkit import slurm_cli
    from toolkit.telemetry.report import html, plots
    from toolkit.telemetry.report.custom import custom_curves

    t0 = time.perf_counter()
    scaled = load_scaled(Path(run_dir), cfg) if streams(Path(run_dir), cfg) else None
    run = scaled.run if scaled is not None else load_run(Path(run_dir))
    try:
        report, series = analyse(run, cfg, scaled)
        if scaled is not None:
            report.scale = {
                "chunk_steps": scaled.chunk_steps,
                "summaries_cached": scaled.summaries_cached,
                "summaries_computed": scaled.summaries_computed,
            }
        out = Path(out_dir) if out_dir else Path(run_dir) / "telemetry" / "report"
        out.mkdir(parents=True, exist_ok=True)
        report.out_dir = out
        if cfg.sacct:
            job_ids = sorted({n.job_id for n in run.nodes if n.job_id})
            report.sacct, report.sacct_note = slurm_cli.sacct_summary(job_ids[0] if job_ids else "")
        else:
            report.sacct_note = "Slurm accounting not asked for (--no-sacct)"
        if cfg.export and scaled is None:
            report.outputs.update(export.write_csv(series, report.events, out))
            trace = export.write_trace(run, series, report.events, out / "trace.json")
            report.outputs["trace"] = str(trace)
        elif cfg.export:  # a long run: chunk means, not every step; no step-level trace
            report.outputs.update(export.write_csv(series, report.events, out, "step_chunks"))
        images: dict[str, Path] = {}
        if cfg.plots:
            images = plots.write_plots(run, series, report, out, cfg.max_plot_points)
            images.update(members.member_plots(report.members, out, cfg.max_plot_points))
            report.outputs.update({k: str(v) for k, v in images.items()})
            made = custom_curves(Path(run_dir), report.events, out, cfg.max_plot_points)
            report.custom_series = {name: str(path) for name, path in made}
        report.elapsed_s = time.perf_counter() - t0
        report.outputs["html"] = str(html.write_html(report, images, out / "report.html"))
        report.outputs["json"] = str(out / "summary.json")
        report.elapsed_s = time.perf_counter() - t0
        (out / "summary.json").write_text(json.dumps(report.to_json(), indent=2, default=str))
        return report
    finally:
        run.close()
