"""The report's tables as rows of text, shared by the terminal (rich) and the HTML page."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.telemetry.report.record import Report


def _ok(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def ms(x: Any) -> str:
    return f"{1000 * x:,.1f}" if _ok(x) else "-"


def pct(x: Any, scale: float = 100.0) -> str:
    return f"{scale * x:.1f}" if _ok(x) else "-"


def num(x: Any, fmt: str = ",.0f") -> str:
    return format(x, fmt) if _ok(x) else "-"


def when(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M:%S")


def gigabytes(x: Any) -> str:
    return num(x / 1e9 if _ok(x) else None, ".2f")


@dataclass(frozen=True)
class Column:
    """One column of the node or rank table: its header, the row key it shows, and how."""

    header: str
    key: str
    fmt: Callable[[Any], str] = str

    def cell(self, row: dict[str, Any]) -> str:
        return self.fmt(row[self.key])


# The columns both tables show, each formatter written once.
NODE_COLUMN = Column("node", "node")
PERFORMANCE_COLUMNS = [
    Column("median step ms", "median_step_s", ms),
    Column("p99 step ms", "p99_step_s", ms),
    Column("tokens/s", "median_tokens_per_s", num),
    Column("MFU %", "median_mfu", pct),
    Column("data wait %", "data_wait_share", pct),
    Column("GPU util %", "gpu_util_pct", partial(pct, scale=1.0)),
    Column("power W", "power_w", num),
    Column("throttle s", "throttle_s", partial(num, fmt=",.1f")),
]
# Last in both tables: print_report sorts the rank rows by it.
STRAGGLER_COLUMN = Column("straggler score", "straggler_score", partial(num, fmt="+.3f"))

NODE_COLUMNS = [
    NODE_COLUMN,
    Column("attempts", "attempts", lambda attempts: ",".join(map(str, attempts))),
    Column("ranks", "ranks"),
    Column("GPUs", "gpus"),
    *PERFORMANCE_COLUMNS,
    Column("IB xmit GB/s", "ib_xmit_bytes_per_s", gigabytes),
    STRAGGLER_COLUMN,
]
RANK_COLUMNS = [
    NODE_COLUMN,
    Column("rank", "rank"),
    Column("steps", "steps"),
    *PERFORMANCE_COLUMNS,
    STRAGGLER_COLUMN,
]
NODE_HEADER = [c.header for c in NODE_COLUMNS]
RANK_HEADER = [c.header for c in RANK_COLUMNS]
# The rate column in the model's unit: tokens/s for a token model, samples/s for any other.
RATE_COLUMNS = {
    "tokens": Column("tokens/s", "median_tokens_per_s", num),
    "samples": Column("samples/s", "median_samples_per_s", num),
}


def in_unit(columns: list[Column], unit: str) -> list[Column]:
    """`columns` with the rate column in `unit`."""
    return [RATE_COLUMNS[unit] if c.key == "median_tokens_per_s" else c for c in columns]


def node_columns(report: Report) -> list[Column]:
    return in_unit(NODE_COLUMNS, report.unit)


def rank_columns(report: Report) -> list[Column]:
    return in_unit(RANK_COLUMNS, report.unit)


def header(columns: list[Column]) -> list[str]:
    return [c.header for c in columns]


def throughput_line(report: Report) -> str:
    """The job's rate in its model's unit and its MFU (medians over the ranks of each
    rank's median; a step record's rate is the job's, all ranks), with where the FLOPs per
    sample came from: the run's RUN/model.json."""
    import numpy as np

    key = RATE_COLUMNS[report.unit].key
    rates = [r[key] for r in report.ranks if _ok(r.get(key))]
    mfus = [r["median_mfu"] for r in report.ranks if _ok(r.get("median_mfu"))]
    rate = f"{float(np.median(rates)):,.0f} {report.unit}/s" if rates else f"- {report.unit}/s"
    mfu = f"MFU {100 * float(np.median(mfus)):.2f}%" if mfus else "MFU -"
    m = report.model
    source = (
        f"{m['flops_per_sample']:.3g} FLOPs per sample, {m['num_params']:,} parameters "
        f"({m['name']}, RUN/model.json)"
        if m is not None
        else "no RUN/model.json"
    )
    return f"Throughput: {rate} (median), {mfu} from {source}"


def table_rows(columns: list[Column], rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[c.cell(row) for c in columns] for row in rows]


def node_rows(report: Report) -> list[list[str]]:
    return table_rows(node_columns(report), report.nodes)


def rank_rows(report: Report) -> list[list[str]]:
    return table_rows(rank_columns(report), report.ranks)


STRAGGLER_HEADER = ["kind", "who", "score", "steps above margin", "metric"]
GAP_HEADER = ["start (UTC)", "end (UTC)", "duration s", "ranks", "explanation"]
ATTRIBUTION_HEADER = ["category", "rank-seconds", "share %"]


def straggler_rows(report: Report) -> list[list[str]]:
    return [
        [s.kind, s.who, f"+{100 * s.score:.1f}%", f"{100 * s.persistence:.0f}%", s.metric]
        for s in report.stragglers
    ]


def _ranks_text(ranks: list[int]) -> str:
    return f"{len(ranks)} ranks" if len(ranks) > 6 else ",".join(map(str, ranks))


def gap_rows(report: Report) -> list[list[str]]:
    return [
        [when(g.start), when(g.end), f"{g.duration_s:,.1f}", _ranks_text(g.ranks), g.explanation]
        for g in report.idle_gaps
    ]


def attribution_rows(report: Report) -> list[list[str]]:
    shares = report.attribution.shares()
    return [
        [k.replace("_", " "), f"{v:,.1f}", f"{100 * shares[k]:.1f}"]
        for k, v in report.attribution.seconds.items()
    ]


def print_report(report: Report, console: Any = None, max_rank_rows: int = 64) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        import sys

        console = Console() if sys.stdout.isatty() else Console(width=180)

    def show(title: str, header: list[str], rows: list[list[str]]) -> None:
        table = Table(title=title, title_justify="left")
        for h in header:
            table.add_column(
                h,
                justify="left"
                if h in ("node", "who", "explanation", "kind", "category", "member")
                else "right",
            )
        for row in rows:
            table.add_row(*row)
        console.print(table)

    console.print(throughput_line(report), soft_wrap=True)
    if report.layout:
        console.print(f"Layout: {report.layout.get('describe', '?')}")
        for line in report.layout.get("warnings", []):
            console.print(f"[yellow]{line}[/yellow]", soft_wrap=True)
    if report.verdict is not None:
        from rich.markup import escape

        from toolkit.telemetry.report.verdict import summary_lines

        console.print("[bold]Diagnosis[/bold]")
        for line in summary_lines(report.verdict):
            console.print(escape(line), soft_wrap=True)
        for path in report.profiles:
            console.print(f"profile: {path}", soft_wrap=True)
    show("Nodes", header(node_columns(report)), node_rows(report))
    ranks = rank_rows(report)
    if len(ranks) > max_rank_rows:
        ranks = sorted(ranks, key=lambda r: -float(r[-1]) if r[-1] != "-" else 0)[:max_rank_rows]
        show(
            f"Ranks (the {max_rank_rows} with the highest straggler score of {len(report.ranks)})",
            header(rank_columns(report)),
            ranks,
        )
    else:
        show("Ranks", header(rank_columns(report)), ranks)
    if report.stragglers:
        show("Stragglers", STRAGGLER_HEADER, straggler_rows(report))
    else:
        console.print("Stragglers: none found")
    if report.idle_gaps:
        show("Idle gaps", GAP_HEADER, gap_rows(report))
    else:
        console.print("Idle gaps: none found")
    show("Where the time went (all ranks)", ATTRIBUTION_HEADER, attribution_rows(report))
    if report.members:  # an ensemble's (trainer.ensemble=K)
        from toolkit.telemetry.report import members

        show("Ensemble members", members.HEADER, members.rows(report.members))
    for group, why in report.absent.items():
        console.print(f"[dim]{group}: absent: {why}[/dim]")
    for path, why in report.skipped:
        console.print(f"[yellow]skipped {path}: {why}[/yellow]")
    console.print(f"[dim]{report.sacct_note}[/dim]")
    if report.sacct:
        for job in report.sacct["jobs"][:5]:
            console.print(
                f"slurm job {job['job_id']}: state {job['state']}, elapsed {job['elapsed_s']} s, "
                f"requeues {job['requeues']}, nodes {job['nodes']}"
            )
    if report.scale is not None:
        console.print(
            f"[dim]read through per-node summaries: steps in chunks of "
            f"{report.scale['chunk_steps']}, {report.scale['summaries_cached']} summaries "
            f"cached, {report.scale['summaries_computed']} computed[/dim]"
        )
    for key, path in report.outputs.items():
        console.print(f"[dim]{key}: {path}[/dim]")
