"""The report's inputs for a long multi-node run, from per-node summaries (summary.py)
instead of every rank's whole step table: a light RunData whose tables are downsampled
series, per-rank series of step chunks (one row per chunk of 2**k steps: its means and step
count), and what the summaries computed exactly (per-rank statistics, the time
attribution, idle gaps, the per-term medians, per-GPU statistics)."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.config.telemetry import ReportConfig
from toolkit.telemetry.read import NodeData, NoTelemetry, RunData, node_files
from toolkit.telemetry.report import analysis, summary
from toolkit.telemetry.report.analysis import Attribution, IdleGap, RankSeries
from toolkit.telemetry.report.gpustats import GpuStats
from toolkit.telemetry.report.model import MEASURED_OF_TERM
from toolkit.telemetry.schema import telemetry_dir

log = logging.getLogger(__name__)


class Columns(dict):
    """A Table look-alike over in-memory columns (what the plots read of a table)."""

    def __len__(self) -> int:
        return len(self["time"]) if "time" in self else 0


@dataclass
class Scaled:
    run: RunData
    series: dict[int, RankSeries]  # one row per step chunk
    gpus: list[GpuStats]
    rank_stats: dict[int, dict[str, float]]
    attribution: Attribution
    idle_gaps: list[IdleGap]
    terms: dict[str, float]
    chunk_steps: int
    summaries_cached: int = 0
    summaries_computed: int = 0
    notes: list[str] = field(default_factory=list)


def _series_of(cached: dict[str, Any]) -> Columns:
    return Columns({k: summary.unpack(v) for k, v in (cached or {}).items()})


def _summaries(files: list[Path], cfg: ReportConfig, jobs: int) -> tuple[list, list]:
    """(summaries, skipped): cached ones read here, the others computed `jobs` at a time."""
    done: dict[Path, dict[str, Any]] = {}
    todo = []
    for path in files:
        cached = summary.load_cached(path, cfg)
        if cached is not None:
            cached["cached"] = True
            done[path] = cached
        else:
            todo.append(path)
    skipped: list[tuple[Path, str]] = []

    def failed(path: Path, exc: BaseException) -> None:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        skipped.append((path, f"{type(exc).__name__}: {reason}"))

    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {p: pool.submit(summary.summarise, p, cfg, False) for p in todo}
            for path, fut in futures.items():
                try:
                    done[path] = fut.result()
                    summary.store(path, {k: v for k, v in done[path].items() if k != "cached"})
                except Exception as exc:  # noqa: BLE001 - name it, skip it, report the rest
                    failed(path, exc)
    else:
        for path in todo:
            try:
                done[path] = summary.summarise(path, cfg, use_cache=False)
                summary.store(path, {k: v for k, v in done[path].items() if k != "cached"})
            except Exception as exc:  # noqa: BLE001
                failed(path, exc)
    return [done[p] for p in files if p in done], skipped


def _light_node(s: dict[str, Any]) -> NodeData:
    attrs = {
        "node": s["node"],
        "attempt": s["attempt"],
        "job_id": s["job_id"],
        "ranks": s["ranks"],
        "world_size": s["world_size"],
    }
    attrs.update({f"{k}_absent_reason": v for k, v in s["absent"].items()})
    node = NodeData(path=Path(s["path"]), file=None, attrs=attrs)  # type: ignore[arg-type]
    node.gpus = {int(i): _series_of(g["series"]) for i, g in s["gpus"].items()}
    node.host = _series_of(s["host_series"]) if s["host_series"] else None  # type: ignore[assignment]
    node.net = {k: _series_of(v) for k, v in s["net_series"].items()}  # type: ignore[misc]
    node.ib = {  # type: ignore[misc]
        f"port{i}": Columns(time=np.zeros(1), xmit_bytes_per_s=np.array([v]))
        for i, v in enumerate(s["ib_xmit_bytes_per_s"])
    }
    node.events = s["events"]
    return node


def _chunk_rows(piece: dict[str, Any], size: int) -> dict[str, np.ndarray]:
    """A piece's chunks regrouped to `size` steps: means per chunk, its index and count."""
    c = piece["chunks"]
    index = summary.unpack(c["index"]) * c["size"] // size
    count = summary.unpack(c["count"]).astype(np.float64)
    have = np.nonzero(np.bincount(index, weights=count))[0]
    n = np.bincount(index, weights=count)[have]
    cols = {"step": have.astype(np.int64), "count": n}
    for name, sums in c["sums"].items():
        total = np.bincount(index, weights=summary.unpack(sums))[have]
        cols["step_mean" if name == "step" else name] = total / n
    return cols


def _rank_series(rank: int, pieces: list[tuple[dict, dict]], size: int) -> RankSeries:
    rows = [(s, _chunk_rows(p, size)) for s, p in pieces]
    names = set.intersection(*(set(cols) for _s, cols in rows))
    cols = {n: np.concatenate([c[n] for _s, c in rows]) for n in names}
    attempt = np.concatenate([np.full(len(c["step"]), s["attempt"]) for s, c in rows])
    nodes = np.concatenate([np.full(len(c["step"]), s["node"], dtype=object) for s, c in rows])
    order = np.argsort(cols["wall_time"], kind="stable")
    latest = max(pieces, key=lambda sp: sp[0]["attempt"])[0]["node"]
    return RankSeries(
        rank,
        latest,
        {n: v[order] for n, v in cols.items()},
        attempt[order],
        nodes[order],
        np.zeros(len(order), dtype=bool),
    )


def _rank_stats(pieces: list[dict[str, Any]]) -> dict[str, float]:
    """Exact for a rank in one file; over attempts, medians are step-weighted means of the
    attempts' medians and p99 the largest (an approximation, said in docs/telemetry.md);
    the data-wait share is exact."""
    n = np.array([p["n"] for p in pieces], dtype=float)

    def mean(key: str) -> float:
        return float(np.average([p[key] for p in pieces], weights=n))

    step = sum(p["measured_step_s"] for p in pieces)
    wait = sum(p["measured_wait_s"] for p in pieces)
    return {
        "steps": int(n.sum()),
        "median_step_s": mean("median_step_s"),
        "p99_step_s": max(p["p99_step_s"] for p in pieces),
        "median_tokens_per_s": mean("median_tokens_per_s"),
        # A summary cached before samples/s was kept has none: NaN, not a KeyError.
        "median_samples_per_s": float(
            np.average([p.get("median_samples_per_s", np.nan) for p in pieces], weights=n)
        ),
        "median_mfu": mean("median_mfu"),
        "data_wait_share": wait / step if step > 0 else 0.0,
    }


def _terms(pieces: list[dict[str, Any]]) -> dict[str, float]:
    """Median over ranks of each rank's median per term (verdict.measured_terms' keys)."""

    def med(field_name: str) -> float:
        v = [p["medians"][field_name] for p in pieces if field_name in p["medians"]]
        return float(np.nanmedian(v)) if v else float("nan")

    terms = {name: med(f) for name, f in MEASURED_OF_TERM.items()}
    terms["exposed_communication"] = med("comm_exposed_s")
    terms["checkpoint_stall"] = med("checkpoint_stall_s")
    return terms


def _raw_gaps(rank: int, pieces: list[tuple[dict, dict]], cfg: ReportConfig) -> list:
    raw = [(a, b, rank, False) for _s, p in pieces for a, b in p["gaps"]]
    ordered = sorted(pieces, key=lambda sp: sp[1]["first_start"])
    for (s0, p0), (s1, p1) in zip(ordered[:-1], ordered[1:], strict=True):
        threshold = max(cfg.idle_gap_min_s, cfg.idle_gap_factor * p0["median_step_s"])
        if p1["first_start"] - p0["last_end"] > threshold:
            restart = s0["attempt"] != s1["attempt"]
            raw.append((p0["last_end"], p1["first_start"], rank, restart))
    return raw


def load_scaled(run_dir: Path, cfg: ReportConfig, jobs: int | None = None) -> Scaled:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NoTelemetry(f"{run_dir}: no such run directory")
    files = node_files(run_dir)
    if not files:
        raise NoTelemetry(f"{run_dir}: no telemetry (expected {telemetry_dir(run_dir)}/node-*.h5)")
    jobs = jobs if jobs is not None else min(2, os.cpu_count() or 1)
    sums, skipped = _summaries(files, cfg, jobs)
    if not sums:
        names = "; ".join(f"{p.name} ({why})" for p, why in skipped)
        raise NoTelemetry(f"{run_dir}: no readable telemetry file: {names}")
    nodes = sorted((_light_node(s) for s in sums), key=lambda n: (n.attempt, n.node))
    run = RunData(run_dir, nodes, skipped)
    by_rank: dict[int, list[tuple[dict, dict]]] = {}
    for s in sorted(sums, key=lambda s: s["attempt"]):
        for r, piece in s["steps"].items():
            by_rank.setdefault(int(r), []).append((s, piece))
    size = max((p["chunks"]["size"] for v in by_rank.values() for _s, p in v), default=1)
    series = {r: _rank_series(r, v, size) for r, v in sorted(by_rank.items())}
    events = sorted((e for n in nodes for e in n.events), key=lambda e: e["start"])
    stat_fields = ("mean_util_pct", "mean_power_w", "throttle_s", "max_temp_c", "energy_j")
    gpus = [
        GpuStats(node=s["node"], index=int(i), **{k: g[k] for k in stat_fields})
        for s in sums
        for i, g in sorted(s["gpus"].items(), key=lambda kv: int(kv[0]))
    ]
    raw = [g for r, v in by_rank.items() for g in _raw_gaps(r, v, cfg)]
    attribution = analysis.attribution_of(
        {
            r: analysis.RankTime(
                sums=[p["sums"] for _s, p in v],
                spans=[(s["attempt"], p["first_start"], p["last_end"]) for s, p in v],
                split=all(p["split_finite"] for _s, p in v),
            )
            for r, v in by_rank.items()
        },
        events,
    )
    return Scaled(
        run=run,
        series=series,
        gpus=gpus,
        rank_stats={r: _rank_stats([p for _s, p in v]) for r, v in by_rank.items()},
        attribution=attribution,
        idle_gaps=analysis.explain_gaps(raw, events),
        terms=_terms([p for v in by_rank.values() for _s, p in v]),
        chunk_steps=size,
        summaries_cached=sum(1 for s in sums if s.get("cached")),
        summaries_computed=sum(1 for s in sums if not s.get("cached")),
    )
