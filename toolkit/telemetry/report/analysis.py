"""The arithmetic of the report, on numpy arrays: per-rank step series merged over nodes
and attempts, statistics, stragglers, idle gaps and where the time went. No I/O here."""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolkit.config.telemetry import ReportConfig
from toolkit.events import last_attempt_rows
from toolkit.telemetry.read import NodeData, RunData
from toolkit.telemetry.schema import CHECKPOINT, EVAL, PREEMPTION, RESTART

NON_BLOCKING_MARKERS = ("write", "background", "async", "upload")


def blocking_span(event: dict[str, Any]) -> tuple[float, float] | None:
    """The part of a checkpoint event during which training waited, or None.

    The checkpoint component emits one `checkpoint` event per save spanning staging and the
    background write, with attrs["stall_s"]: the loop was blocked from the start for that
    long. Without stall_s the whole event blocks, unless its phase (attrs["phase"] or the
    name after "checkpoint") says the work ran in the background."""
    name = event["name"]
    if not name.startswith(CHECKPOINT):
        return None
    stall = event["attrs"].get("stall_s")
    if isinstance(stall, (int, float)):
        return (event["start"], event["start"] + max(0.0, float(stall)))
    phase = f"{name} {event['attrs'].get('phase', '')}".lower()
    if any(marker in phase for marker in NON_BLOCKING_MARKERS):
        return None
    return (event["start"], event["end"])


def is_blocking_checkpoint(event: dict[str, Any]) -> bool:
    span = blocking_span(event)
    return span is not None and span[1] > span[0]


def explaining_spans(events: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(start, end, name) of what can explain a pause between steps: checkpoint stalls,
    evaluations, preemptions and restarts."""
    out = []
    for e in events:
        span = blocking_span(e)
        if span is not None:
            out.append((span[0], span[1], e["name"]))
        elif e["name"] in (EVAL, PREEMPTION, RESTART):
            out.append((e["start"], e["end"], e["name"]))
    return out


@dataclass
class RankSeries:
    """One rank's steps over all attempts, in wall-time order."""

    rank: int
    node: str  # node of the latest attempt
    columns: dict[str, np.ndarray]
    attempt: np.ndarray
    node_of_row: np.ndarray  # node name per row
    warmup: np.ndarray  # True for the first skip_first_steps rows of each attempt

    def __len__(self) -> int:
        return len(self.attempt)

    @property
    def start(self) -> np.ndarray:
        return self.columns["wall_time"] - self.columns["step_time_s"]


def collect_steps(run: RunData, skip_first_steps: int) -> dict[int, RankSeries]:
    parts: dict[int, list[tuple[NodeData, dict[str, np.ndarray]]]] = {}
    for node in run.nodes:
        for rank, table in node.steps.items():
            if len(table) == 0:
                continue
            parts.setdefault(rank, []).append((node, {n: table[n] for n in table.names}))
    out = {}
    for rank, pieces in parts.items():
        names = set.intersection(*(set(cols) for _n, cols in pieces))
        columns = {n: np.concatenate([cols[n] for _n, cols in pieces]) for n in names}
        attempt = np.concatenate([np.full(len(c["step"]), nd.attempt) for nd, c in pieces])
        nodes = np.concatenate([np.full(len(c["step"]), nd.node, dtype=object) for nd, c in pieces])
        warm = np.concatenate([np.arange(len(c["step"])) < skip_first_steps for _nd, c in pieces])
        order = np.argsort(columns["wall_time"], kind="stable")
        # A resumed attempt repeats the steps after its checkpoint: its records stand.
        kept = last_attempt_rows(columns["step"][order].tolist(), attempt[order].tolist())
        order = order[kept]
        columns = {n: v[order] for n, v in columns.items()}
        latest = pieces[int(np.argmax([nd.attempt for nd, _c in pieces]))][0].node
        out[rank] = RankSeries(rank, latest, columns, attempt[order], nodes[order], warm[order])
    return dict(sorted(out.items()))


def _measured(series: RankSeries, name: str) -> np.ndarray:
    values = series.columns[name][~series.warmup]
    return values if len(values) else series.columns[name]


def rank_stats(series: RankSeries) -> dict[str, float]:
    step = _measured(series, "step_time_s")
    wait = _measured(series, "data_wait_s")
    return {
        "steps": int(len(series)),
        "median_step_s": float(np.median(step)),
        "p99_step_s": float(np.percentile(step, 99)),
        "median_tokens_per_s": float(np.median(_measured(series, "tokens_per_s"))),
        "median_samples_per_s": float(np.median(_measured(series, "samples_per_s")))
        if "samples_per_s" in series.columns  # an older node file has no samples/s
        else float("nan"),
        "median_mfu": float(np.median(_measured(series, "mfu"))),
        "data_wait_share": float(wait.sum() / step.sum()) if step.sum() > 0 else 0.0,
    }


@dataclass
class Straggler:
    kind: str  # "rank" | "node"
    who: str  # "rank 13 (gpu-node001)" | "gpu-node003"
    score: float  # median (value / per-step median of all) - 1
    persistence: float  # fraction of steps above 1 + margin
    metric: str


def _step_matrix(series: dict[int, RankSeries], metric: str) -> tuple[list[int], np.ndarray]:
    ranks = list(series)
    max_step = max(int(s.columns["step"].max()) for s in series.values())
    m = np.full((len(ranks), max_step + 1), np.nan)
    for i, r in enumerate(ranks):
        s = series[r]
        keep = ~s.warmup
        m[i, s.columns["step"][keep]] = s.columns[metric][keep]  # later attempts overwrite
    return ranks, m


def _ratio_scores(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: median ratio - 1, fraction of columns above, over the per-column median."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = np.nanmedian(m, axis=0)
        ratio = m / ref
        score = np.nanmedian(ratio, axis=1) - 1.0
    return ratio, score, ref


def find_stragglers(series: dict[int, RankSeries], cfg: ReportConfig) -> list[Straggler]:
    if len(series) < 2:
        return []
    metric = cfg.straggler_metric
    ranks, m = _step_matrix(series, metric)
    out: list[Straggler] = []
    ratio, score, _ = _ratio_scores(m)
    counted = np.isfinite(ratio)
    above = np.where(counted, ratio > 1 + cfg.straggler_margin, False)
    persistence = above.sum(axis=1) / np.maximum(counted.sum(axis=1), 1)
    for i, r in enumerate(ranks):
        if score[i] > cfg.straggler_margin and persistence[i] >= cfg.straggler_persistence:
            out.append(
                Straggler(
                    "rank",
                    f"rank {r} ({series[r].node})",
                    float(score[i]),
                    float(persistence[i]),
                    metric,
                )
            )
    nodes = sorted({s.node for s in series.values()})
    if len(nodes) >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            nm = np.stack(
                [
                    np.nanmedian(m[[i for i, r in enumerate(ranks) if series[r].node == n]], axis=0)
                    for n in nodes
                ]
            )
        ratio, score, _ = _ratio_scores(nm)
        counted = np.isfinite(ratio)
        above = np.where(counted, ratio > 1 + cfg.straggler_margin, False)
        persistence = above.sum(axis=1) / np.maximum(counted.sum(axis=1), 1)
        for i, n in enumerate(nodes):
            if score[i] > cfg.straggler_margin and persistence[i] >= cfg.straggler_persistence:
                out.append(Straggler("node", n, float(score[i]), float(persistence[i]), metric))
    return sorted(out, key=lambda s: -s.score)


def straggler_scores(series: dict[int, RankSeries], metric: str) -> dict[int, float]:
    """Every rank's score (median ratio to the per-step median, minus one)."""
    if len(series) < 2:
        return {r: 0.0 for r in series}
    ranks, m = _step_matrix(series, metric)
    _, score, _ = _ratio_scores(m)
    return {r: float(score[i]) for i, r in enumerate(ranks)}


@dataclass
class IdleGap:
    start: float
    end: float
    ranks: list[int]
    explanation: str
    explained_share: float

    @property
    def duration_s(self) -> float:
        return self.end - self.start


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the union of intervals."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def find_idle_gaps(
    series: dict[int, RankSeries], events: list[dict[str, Any]], cfg: ReportConfig
) -> list[IdleGap]:
    """Stretches between two steps of a rank, outside steps, longer than
    max(idle_gap_min_s, idle_gap_factor x median step), merged over ranks and explained by
    the events that cover them (checkpoint, eval, preemption, restart)."""
    raw: list[tuple[float, float, int, bool]] = []
    for r, s in series.items():
        if len(s) < 2:
            continue
        threshold = max(
            cfg.idle_gap_min_s, cfg.idle_gap_factor * float(np.median(s.columns["step_time_s"]))
        )
        start = s.start
        end = s.columns["wall_time"]
        gap = start[1:] - end[:-1]
        for i in np.nonzero(gap > threshold)[0]:
            restart = bool(s.attempt[i] != s.attempt[i + 1])
            raw.append((float(end[i]), float(start[i + 1]), r, restart))
    return explain_gaps(raw, events)


def explain_gaps(
    raw: list[tuple[float, float, int, bool]], events: list[dict[str, Any]]
) -> list[IdleGap]:
    """(end of a step, start of the next, rank, attempt changed) merged over ranks and
    explained by the events that cover them."""
    raw = sorted(raw)
    merged: list[list[Any]] = []
    for a, b, r, restart in raw:
        if merged and a <= merged[-1][1]:
            m = merged[-1]
            m[0], m[1] = min(m[0], a), max(m[1], b)
            m[2].add(r)
            m[3] = m[3] or restart
        else:
            merged.append([a, b, {r}, restart])
    explaining = explaining_spans(events)
    out = []
    for a, b, ranks, restart in merged:
        names = sorted({name for s, e, name in explaining if e >= a and s <= b})
        share = _covered([(s, e) for s, e, _name in explaining], a, b) / max(b - a, 1e-9)
        if restart:
            text = "restart (job attempt changed)" + (
                f"; events: {', '.join(names)}" if names else ""
            )
            share = 1.0
        elif names and share >= 0.5:
            text = f"{', '.join(names)} ({100 * share:.0f}% covered)"
        else:
            text = "unexplained" + (
                f" (events cover {100 * share:.0f}%: {', '.join(names)})" if names else ""
            )
        out.append(IdleGap(a, b, sorted(ranks), text, share))
    return out


@dataclass
class Attribution:
    """Seconds per category summed over ranks (and the share of the ranks' wall time)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def shares(self) -> dict[str, float]:
        total = self.total_s or 1.0
        return {k: v / total for k, v in self.seconds.items()}


SPLIT_FIELDS = ("compute_s", "comm_exposed_s", "optimizer_step_s", "checkpoint_stall_s")


def has_split(columns: dict[str, np.ndarray]) -> bool:
    """Steps that carry the step's split (files written before it have NaN or no column)."""
    return all(f in columns and np.isfinite(columns[f]).all() for f in SPLIT_FIELDS)


@dataclass
class RankTime:
    """What the attribution needs of one rank: column sums per file (attempt), the
    (attempt, first step start, last step end) of each, and whether steps carry the split."""

    sums: list[dict[str, float]]
    spans: list[tuple[int, float, float]]
    split: bool


def attribute_time(series: dict[int, RankSeries], events: list[dict[str, Any]]) -> Attribution:
    """Each rank's wall time from its first step start to its last step end (per attempt),
    split into compute, data wait, communication (when steps carry comm_s), checkpoint stall,
    evaluation and other/idle; restart downtime between attempts is counted apart."""
    ranks = {}
    for r, s in series.items():
        cols = s.columns
        sums = {n: float(cols[n].sum()) for n in SUM_FIELDS if n in cols}
        spans = [
            (
                int(a),
                float(s.start[s.attempt == a].min()),
                float(cols["wall_time"][s.attempt == a].max()),
            )
            for a in np.unique(s.attempt)
        ]
        ranks[r] = RankTime([sums], spans, has_split(cols))
    return attribution_of(ranks, events)


SUM_FIELDS = ("step_time_s", "data_wait_s", "comm_s") + SPLIT_FIELDS


def attribution_of(ranks: dict[int, RankTime], events: list[dict[str, Any]]) -> Attribution:
    cats = dict.fromkeys(
        ("compute", "data_wait", "communication", "checkpoint_stall", "eval", "idle_other"), 0.0
    )
    downtime = 0.0
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        by_rank.setdefault(e["rank"], []).append(e)
    for r, rt in ranks.items():

        def total(name: str, rt: RankTime = rt) -> float:
            return float(sum(s.get(name, 0.0) for s in rt.sums))

        in_step, wait, comm = total("step_time_s"), total("data_wait_s"), total("comm_s")
        spans = sorted(rt.spans)
        span = sum(end - start for _a, start, end in spans)
        downtime += sum(max(0.0, b[1] - a[2]) for a, b in zip(spans[:-1], spans[1:], strict=True))
        mine = by_rank.get(r, [])
        blocking = [blocking_span(e) for e in mine]
        stall = sum(b[1] - b[0] for b in blocking if b is not None)
        ev = sum(e["end"] - e["start"] for e in mine if e["name"] == EVAL)
        if rt.split:  # steps carry their split
            cats.setdefault("optimizer", 0.0)
            cats["compute"] += total("compute_s")
            cats["communication"] += total("comm_exposed_s")
            cats["optimizer"] += total("optimizer_step_s")
            in_step_stall = total("checkpoint_stall_s")
            cats["checkpoint_stall"] += in_step_stall
            other = in_step - wait - in_step_stall - total("compute_s")
            other -= total("comm_exposed_s") + total("optimizer_step_s")
            cats["idle_other"] += max(0.0, other)
        else:
            cats["compute"] += in_step - wait - comm
            cats["communication"] += comm
        cats["data_wait"] += wait
        cats["checkpoint_stall"] += stall
        cats["eval"] += ev
        cats["idle_other"] += max(0.0, span - in_step - stall - ev)
    if not any(
        c in s for rt in ranks.values() for s in rt.sums for c in ("comm_s", "comm_exposed_s")
    ):
        cats.pop("communication")
    cats["restart_downtime"] = downtime
    return Attribution(cats)


def median_or_nan(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
