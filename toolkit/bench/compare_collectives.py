"""Rank the settings of a benchmark sweep by bus bandwidth, per op and message-size band.

    python -m toolkit.launch -m task=bench_collectives nccl=auto,ethernet nccl.env.NCCL_BUFFSIZE=1048576,4194304
    python -m toolkit.bench.compare_collectives SWEEP_DIR [--bands 65536,16777216]

Reads SWEEP_DIR/<i>/collectives.h5 and SWEEP_DIR/<i>/launch.yaml (the overrides, which name
each point: only the overrides that differ between points are shown), prints one ranking per
(op, band) and writes SWEEP_DIR/compare_collectives.{txt,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf

from toolkit.collectives.busbw import average
from toolkit.collectives.report import H5_NAME, Row, read_h5

DEFAULT_BANDS = (64 << 10, 16 << 20)  # small < 64 KiB <= medium < 16 MiB <= large


@dataclass
class Point:
    label: str
    run_dir: str
    rows: list[Row]


@dataclass
class Ranked:
    op: str
    band: str
    place: int
    label: str
    busbw_gbps: float
    vs_best: float  # fraction of the best setting's busbw in this band
    num_sizes: int


def human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def band_names(bounds: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """[(name, lo, hi)] with lo <= size < hi."""
    edges = [0, *bounds, 1 << 62]
    names = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        if lo == 0:
            names.append((f"< {human(hi)}", lo, hi))
        elif hi == 1 << 62:
            names.append((f">= {human(lo)}", lo, hi))
        else:
            names.append((f"{human(lo)} - {human(hi)}", lo, hi))
    return names


def labels(overrides: list[list[str]]) -> list[str]:
    """Each point's overrides that are not shared by every point."""
    common = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    out = []
    for i, items in enumerate(overrides):
        own = [o for o in items if o not in common]
        out.append(" ".join(own) or f"point {i}")
    return out


def load_sweep(sweep_dir: Path) -> list[Point]:
    runs = sorted(
        (p for p in sweep_dir.iterdir() if (p / H5_NAME).is_file()),
        key=lambda p: (len(p.name), p.name),
    )
    overrides = []
    for run in runs:
        launch = run / "launch.yaml"
        items = OmegaConf.load(launch).overrides if launch.is_file() else []
        overrides.append([str(o) for o in items])
    return [
        Point(label=label, run_dir=str(run), rows=read_h5(run / H5_NAME)[0])
        for run, label in zip(runs, labels(overrides), strict=True)
    ]


def rank_points(points: list[Point], bounds: tuple[int, ...] = DEFAULT_BANDS) -> list[Ranked]:
    ranked: list[Ranked] = []
    ops = list(dict.fromkeys(r.op for p in points for r in p.rows))
    for op in ops:
        for band, lo, hi in band_names(bounds):
            scores = []
            for p in points:
                rows = [r for r in p.rows if r.op == op and lo <= r.size_bytes < hi]
                if rows:
                    scores.append((average([r.busbw_gbps for r in rows]), p.label, len(rows)))
            if not scores:
                continue
            scores.sort(key=lambda s: -s[0])
            best = scores[0][0]
            for place, (bw, label, count) in enumerate(scores, start=1):
                ranked.append(
                    Ranked(op, band, place, label, bw, bw / best if best > 0 else 0.0, count)
                )
    return ranked


def format_ranking(ranked: list[Ranked]) -> str:
    lines = [f"# {'op':<15} {'band':<18} {'#':>2} {'busbw GB/s':>11} {'vs best':>8}  setting"]
    previous = None
    for r in ranked:
        key = (r.op, r.band)
        if previous is not None and key != previous:
            lines.append("")
        previous = key
        lines.append(
            f"  {r.op:<15} {r.band:<18} {r.place:>2} {r.busbw_gbps:>11.4f} {r.vs_best:>7.1%}  {r.label}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.compare_collectives")
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument(
        "--bands",
        default=",".join(map(str, DEFAULT_BANDS)),
        help="band edges in bytes, comma-separated (default: 65536,16777216)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        bounds = tuple(sorted(int(b) for b in args.bands.split(",") if b.strip()))
    except ValueError:
        print(f"error: --bands={args.bands}: expected comma-separated byte counts", file=sys.stderr)
        return 2
    if not args.sweep_dir.is_dir():
        print(f"error: {args.sweep_dir}: no such directory", file=sys.stderr)
        return 2
    points = load_sweep(args.sweep_dir)
    if not points:
        print(
            f"error: {args.sweep_dir}: no */{H5_NAME} (run a bench_collectives sweep first)",
            file=sys.stderr,
        )
        return 2
    ranked = rank_points(points, bounds)
    text = format_ranking(ranked)
    print(text)
    (args.sweep_dir / "compare_collectives.txt").write_text(text + "\n")
    (args.sweep_dir / "compare_collectives.json").write_text(
        json.dumps(
            {
                "points": [{"label": p.label, "run_dir": p.run_dir} for p in points],
                "ranking": [asdict(r) for r in ranked],
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
