"""The diagnosis the report starts with: the step's dominant cost against the performance
model's prediction, then findings (stragglers, data-loader starvation, checkpoint stalls,
exposed communication, idle gaps, throttling, XID errors), each with the time it cost this
run, the numbers that show it, and the change most likely to help. Pure arithmetic on what
the report already computed; no I/O."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolkit.config.telemetry import ReportConfig
from toolkit.telemetry.report import analysis
from toolkit.telemetry.report.analysis import Attribution, IdleGap, RankSeries
from toolkit.telemetry.report.gpustats import GpuStats
from toolkit.telemetry.report.model import MEASURED_OF_TERM
from toolkit.telemetry.schema import XID

HANG = "hang"  # the event the node agent writes when its watchdog ends a hung job
COMM_FIELDS = ("comm_all_gather_s", "comm_reduce_scatter_s", "comm_all_reduce_s", "comm_p2p_s")
# A finding is reported when it cost at least this share of the ranks' time.
MIN_SHARE = {"data": 0.05, "checkpoint": 0.02, "communication": 0.15}
# A straggler finding needs a rank this much slower in compute than the median (the
# stragglers table keeps the report's own, finer margin): shared hosts jitter by 10 %.
MIN_STRAGGLER_SCORE = 0.2


@dataclass
class Finding:
    kind: str  # straggler | data_loader | checkpoint_stall | communication | idle_gap | ...
    lost_s: float  # rank-seconds this cost the run (what ordering uses)
    share: float  # of all ranks' time
    what: str  # the finding, with this run's numbers
    action: str  # the override or action most likely to help


@dataclass
class Verdict:
    dominant: str
    dominant_share: float
    terms: dict[str, float]  # median seconds per step, measured
    predicted: dict[str, float]  # seconds per step, performance model
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measured: bool = True  # False: no rank's step time reached the telemetry (nothing to split)
    # Why nothing was measured when the node agent recorded it (e.g. a full disk); '' else.
    unmeasured_why: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _median(series: dict[int, RankSeries], name: str) -> float:
    values = [analysis._measured(s, name) for s in series.values() if name in s.columns]
    return float(np.median(np.concatenate(values))) if values else float("nan")


def measured_terms(series: dict[int, RankSeries]) -> dict[str, float]:
    """Median seconds per step of every term (over ranks and measured steps)."""
    terms = {name: _median(series, field) for name, field in MEASURED_OF_TERM.items()}
    busy = [
        sum(analysis._measured(s, f) for f in COMM_FIELDS if f in s.columns)
        for s in series.values()
        if COMM_FIELDS[0] in s.columns
    ]
    terms["communication"] = float(np.median(np.concatenate(busy))) if busy else float("nan")
    terms["exposed_communication"] = _median(series, "comm_exposed_s")
    terms["checkpoint_stall"] = _median(series, "checkpoint_stall_s")
    return terms


def _straggler_wait(series: dict[int, RankSeries]) -> tuple[list[int], np.ndarray, float]:
    """Per-step compute matrix (ranks x steps) and the rank-seconds fast ranks waited for
    the slowest one (sum over steps of max - each rank's compute)."""
    ranks, m = analysis._step_matrix(series, "compute_s")
    w = _steps_per_row(series)
    cols = np.all(np.isfinite(m), axis=0)
    m = m[:, cols]
    if m.size == 0:
        return ranks, m, 0.0
    return ranks, m, float(((m.max(axis=0) - m) * w[:, cols]).sum())


def _steps_per_row(series: dict[int, RankSeries]) -> np.ndarray:
    """Steps each matrix cell stands for: 1, or a chunk's step count (report/scaled.py)."""
    chunks = all("count" in s.columns for s in series.values())
    _ranks, m = analysis._step_matrix(series, "count" if chunks else "step_time_s")
    return np.nan_to_num(m) if chunks else np.ones_like(m)


def _waited_for(series: dict[int, RankSeries], straggler: int) -> float:
    """Rank-seconds the other ranks spent in collectives beyond what the straggler spent
    (it rarely waits for them): their wait for it, step by step."""
    if "comm_exposed_s" not in series[straggler].columns:
        return 0.0
    ranks, m = analysis._step_matrix(series, "comm_exposed_s")
    mine = m[ranks.index(straggler)]
    w = np.delete(_steps_per_row(series), ranks.index(straggler), axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        excess = np.clip(np.delete(m, ranks.index(straggler), axis=0) - mine, 0, None)
    return float(np.nansum(excess * w))


# A model whose predicted arithmetic is under this share of the measured step, on several
# ranks, is too small for them: the rest is per-op cost and collectives, which more ranks
# do not shrink.
SMALL_MODEL_SHARE = 0.1
MAX_SUGGESTED_ENSEMBLE = 32


def too_small(verdict: Verdict, ranks: int, trainer: Any) -> tuple[str, str] | None:
    """(diagnosis, remedy) for a model too small for its ranks (None where it is not, or
    where the model's arithmetic or the measured step is unknown): fewer ranks, a larger
    micro-batch, or K members in one step (trainer.ensemble, toolkit.train.ensemble)."""
    work = verdict.predicted.get("arithmetic", float("nan"))
    step = verdict.terms.get("step", float("nan"))
    if ranks < 2 or not (np.isfinite(work) and np.isfinite(step)) or work <= 0:
        return None
    if work >= SMALL_MODEL_SHARE * step:
        return None
    k = max(2, min(MAX_SUGGESTED_ENSEMBLE, int(step / work)))
    micro = getattr(trainer, "micro_batch_size", None)
    batch = getattr(trainer, "global_batch_size", None)
    if isinstance(batch, int):  # the micro-batch follows the global batch
        larger = f"trainer.global_batch_size={2 * batch}"
    else:
        larger = f"trainer.micro_batch_size={2 * micro}" if isinstance(micro, int) else "it"
    what = (
        f"the model is too small for its {ranks} ranks: its arithmetic is {1000 * work:.2f} ms "
        f"of a {1000 * step:.1f} ms step ({100 * work / step:.1f}%), the rest per-op cost and "
        "collectives, which tuning the collectives does not remove"
    )
    remedy = (
        f"run on fewer ranks, raise the micro-batch ({larger}), or train {k} models in each "
        f"step (trainer.ensemble={k})"
    )
    return what, remedy


def diagnose(
    series: dict[int, RankSeries],
    attribution: Attribution,
    gaps: list[IdleGap],
    gpus: list[GpuStats],
    events: list[dict[str, Any]],
    cfg: ReportConfig,
    job: Any,
    predicted: dict[str, float],
    model_note: str = "",
    terms: dict[str, float] | None = None,
) -> Verdict:
    """`terms`: the measured per-term medians when the caller has them exactly (a long
    run's per-node summaries); else computed from the series."""
    seconds = {k: v for k, v in attribution.seconds.items() if k != "restart_downtime"}
    total = sum(seconds.values()) or 1.0
    dominant = max(seconds, key=lambda k: seconds[k]) if seconds else "compute"
    verdict = Verdict(
        dominant=dominant,
        dominant_share=seconds.get(dominant, 0.0) / total,
        terms=terms if terms is not None else (measured_terms(series) if series else {}),
        predicted=predicted,
        measured=sum(seconds.values()) > 0,
    )
    if model_note:
        verdict.notes.append(model_note)
    findings = verdict.findings
    has_compute = bool(series) and all(analysis.has_split(s.columns) for s in series.values())

    # Stragglers: per-rank compute does not equalise the way step time does.
    wait_s = 0.0
    if has_compute and len(series) >= 2:
        sc = dataclasses.replace(cfg, straggler_metric="compute_s")
        ranks, m, wait_s = _straggler_wait(series)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = float(np.median(m)) if m.size else float("nan")
        for s in analysis.find_stragglers(series, sc):
            if s.kind != "rank" or s.score < MIN_STRAGGLER_SCORE:
                continue
            rank = int(s.who.split()[1])
            wait_s = max(wait_s, _waited_for(series, rank))
            node = series[rank].node
            mine = float(np.median(analysis._measured(series[rank], "compute_s")))
            findings.append(
                Finding(
                    "straggler",
                    wait_s,
                    wait_s / total,
                    f"rank {rank} on {node} is a straggler: compute_s median {1000 * mine:.1f} "
                    f"ms vs {1000 * med:.1f} ms over all ranks (+{100 * s.score:.0f}%, on "
                    f"{100 * s.persistence:.0f}% of steps); the other ranks waited "
                    f"{wait_s:.1f} rank-s for it in collectives",
                    f"exclude node {node} (cluster.exclude={node}) and check its clocks, "
                    "throttling and neighbours",
                )
            )
            break  # the worst one leads; the others are in the stragglers table

    data = seconds.get("data_wait", 0.0)
    if data / total >= MIN_SHARE["data"]:
        per_step = verdict.terms.get("data_wait", float("nan"))
        prefetch = getattr(getattr(job, "data", None), "prefetch", None)
        more = f"data.prefetch={prefetch + 2}" if isinstance(prefetch, int) else "data.prefetch"
        findings.append(
            Finding(
                "data_loader",
                data,
                data / total,
                f"data-loader starvation: ranks waited {data:.1f} rank-s for batches "
                f"({100 * data / total:.0f}% of their time, median {1000 * per_step:.1f} ms "
                f"of a {1000 * verdict.terms.get('step', float('nan')):.1f} ms step)",
                f"more loader workers / deeper prefetch ({more}); check the data source's "
                "read rate",
            )
        )

    stall = seconds.get("checkpoint_stall", 0.0)
    if stall / total >= MIN_SHARE["checkpoint"]:
        ckpt = getattr(job, "checkpoint", None)
        saves = [e for e in events if e["name"].startswith("checkpoint")]
        spans = [(analysis.blocking_span(e) or (0.0, 0.0), e["step"]) for e in saves]
        (a, b), worst_step = max(spans, key=lambda x: x[0][1] - x[0][0], default=((0, 0), 0))
        if ckpt is not None and not ckpt.async_save:
            action = "checkpoint.async_save=true (write in the background)"
        elif ckpt is not None and ckpt.interval_steps > 0:
            action = (
                f"raise checkpoint.interval_steps (now {ckpt.interval_steps}) or check the "
                "storage's write rate"
            )
        else:
            action = "check the checkpoint storage's write rate; save less often"
        findings.append(
            Finding(
                "checkpoint_stall",
                stall,
                stall / total,
                f"checkpoint stalls: training waited {stall:.1f} rank-s for checkpoints "
                f"({100 * stall / total:.0f}% of the ranks' time; {len(saves)} save events, "
                f"longest stall {b - a:.1f} s at step {worst_step})",
                action,
            )
        )

    comm = max(0.0, seconds.get("communication", 0.0) - wait_s)
    small = too_small(verdict, len(series), getattr(job, "trainer", None))
    if comm / total >= MIN_SHARE["communication"]:
        parallel = getattr(job, "parallel", None)
        trainer = getattr(job, "trainer", None)
        if small:  # no tuning of the collectives hides them behind so little work
            action = f"{small[0]}: {small[1]}"
        elif parallel is not None and parallel.reshard_after_forward:
            action = "parallel.reshard_after_forward=false (no all-gather again in backward)"
        elif trainer is not None:
            action = (
                f"raise the micro-batch (trainer.micro_batch_size={2 * trainer.micro_batch_size})"
                " so that each collective moves more work"
            )
        else:
            action = "raise the micro-batch so that each collective moves more work"
        busy = verdict.terms.get("communication", float("nan"))
        findings.append(
            Finding(
                "communication",
                comm,
                comm / total,
                f"exposed communication: {comm:.1f} rank-s ({100 * comm / total:.0f}% of the "
                f"ranks' time) waiting in collectives; median {1000 * busy:.1f} ms per step in "
                f"collectives, {1000 * verdict.terms.get('exposed_communication', 0.0):.1f} ms "
                "of it exposed",
                action,
            )
        )

    elif small:
        share = 1.0 - verdict.predicted["arithmetic"] / verdict.terms["step"]
        findings.append(Finding("small_model", 0.0, share, *small))

    unexplained = [g for g in gaps if g.explanation.startswith("unexplained")]
    if unexplained:
        lost = sum(g.duration_s * len(g.ranks) for g in unexplained)
        longest = max(unexplained, key=lambda g: g.duration_s)
        findings.append(
            Finding(
                "idle_gap",
                lost,
                lost / total,
                f"{len(unexplained)} unexplained idle gaps, {lost:.1f} rank-s; the longest "
                f"{longest.duration_s:.1f} s on ranks {longest.ranks[:8]}",
                "read the rank logs at that time (eval, I/O, host contention)",
            )
        )

    for g in gpus:
        if g.throttle_s > 0:
            findings.append(
                Finding(
                    "throttling",
                    g.throttle_s,
                    g.throttle_s / total,
                    f"GPU {g.index} on {g.node} throttled (power/thermal) for {g.throttle_s:.0f} s"
                    f" (max {g.max_temp_c:.0f} C)",
                    f"check cooling and power capping on {g.node}; exclude it if it persists",
                )
            )
    for e in (e for e in events if e["name"] == HANG):  # the agent's watchdog (watchdog.py)
        attrs = e["attrs"]
        lost = float(attrs.get("stuck_for_s", 0.0)) * max(len(series), 1)
        hosts = ",".join(attrs.get("stuck_hosts") or []) or "?"
        findings.append(
            Finding(
                "hang",
                lost,
                min(1.0, lost / total),
                str(attrs.get("message", "hang")),
                f"read the stacks of ranks {attrs.get('stuck_ranks')} in the hang directory; "
                f"if {hosts} is at fault, exclude it (cluster.exclude={hosts})",
            )
        )
    xids = [e for e in events if e["name"] == XID]
    for node in sorted({e["node"] for e in xids}):
        codes = sorted({str(e["attrs"].get("xid")) for e in xids if e["node"] == node})
        findings.append(
            Finding(
                "xid",
                0.0,
                0.0,
                f"XID errors on {node}: {', '.join(codes)}",
                f"drain {node} and exclude it (cluster.exclude={node})",
            )
        )
    findings.sort(key=lambda f: (-f.lost_s, f.kind))
    # In a synchronous job the others' exposed communication includes waiting for the
    # straggler (no timer tells the two apart): the straggler is fixed first.
    kinds = [f.kind for f in findings]
    if "straggler" in kinds and "communication" in kinds:
        straggler = findings.pop(kinds.index("straggler"))
        findings.insert(min(kinds.index("communication"), len(findings)), straggler)
    if not findings and verdict.measured:
        findings.append(
            Finding(
                dominant,
                seconds.get(dominant, 0.0),
                verdict.dominant_share,
                f"no bottleneck besides the step's own work: {dominant} is "
                f"{100 * verdict.dominant_share:.0f}% of the ranks' time",
                "raise the micro-batch or use bf16 for more work per step"
                if dominant == "compute"
                else "see the attribution table",
            )
        )
    return verdict


# The node file's errors that mean its disk (or quota) is full (h5store.write_failure text).
DISK_FULL_ERRORS = ("No space left on device", "Disk quota exceeded", "File too large")


def unmeasured_why(absent: dict[str, str]) -> str:
    """Why no step record is in the node files when the node agent recorded it: rows it
    could not write (the node file's `steps_absent_reason`, e.g. `partly: 40 rows not
    written (No space left on device) (e.g. node1)`); '' when it recorded nothing."""
    why = absent.get("steps", "")
    if "rows not written" not in why:
        return ""
    full = any(error in why for error in DISK_FULL_ERRORS)
    return (
        f"{'disk full: ' if full else ''}the node agent could not write the step records "
        f"({why}); free space under RUN_DIR/telemetry or set telemetry=off"
    )


def summary_lines(v: Verdict) -> list[str]:
    """The diagnosis as a few lines of text (terminal and HTML)."""
    if v.measured:
        lines = [f"dominant cost: {v.dominant} ({100 * v.dominant_share:.0f}% of the ranks' time)"]
    elif v.unmeasured_why:  # the node agent said why: a full disk, a quota
        lines = [f"dominant cost: not measured: {v.unmeasured_why}"]
    else:  # say that the data is missing, not "compute (0%)"
        lines = [
            "dominant cost: not measured: no step records reached the node telemetry (was "
            "the node agent killed? see RUN_DIR/logs/telemetry-<node>.log and the ranks' logs)"
        ]
    if v.predicted:
        parts = []
        for term in ("step", "compute", "communication", "optimizer", "data_wait"):
            got, want = v.terms.get(term, float("nan")), v.predicted.get(term, float("nan"))
            ratio = f" (x{got / want:.1f})" if want > 0 and np.isfinite(got) else ""
            measured = f"{1000 * got:.1f} ms" if np.isfinite(got) else "not measured"
            model = f"{1000 * want:.2f} ms" if np.isfinite(want) else "not modelled"
            parts.append(f"{term} {measured} vs model {model}{ratio}")
        lines.append("measured vs model per step: " + "; ".join(parts))
    for i, f in enumerate(v.findings, 1):
        lines.append(f"{i}. {f.what} -> {f.action}")
    lines += v.notes
    return lines
