"""`python -m toolkit.telemetry report|watch RUN_DIR`, `... compare RUN_A RUN_B`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.config.errors import ConfigError
from toolkit.config.telemetry import STRAGGLER_METRICS, ReportConfig
from toolkit.telemetry.read import NoTelemetry


def parse_args(argv: list[str]) -> argparse.Namespace:
    d = ReportConfig()
    parser = argparse.ArgumentParser(prog="python -m toolkit.telemetry")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser(
        "report", help="summarise a run's telemetry: tables, plots, HTML, CSV, trace"
    )
    rep.add_argument("run_dir", type=Path)
    rep.add_argument(
        "--out", type=Path, default=None, help="output folder (RUN_DIR/telemetry/report)"
    )
    rep.add_argument("--straggler-margin", type=float, default=d.straggler_margin)
    rep.add_argument("--straggler-persistence", type=float, default=d.straggler_persistence)
    rep.add_argument("--straggler-metric", choices=STRAGGLER_METRICS, default=d.straggler_metric)
    rep.add_argument("--idle-gap-min-s", type=float, default=d.idle_gap_min_s)
    rep.add_argument("--idle-gap-factor", type=float, default=d.idle_gap_factor)
    rep.add_argument("--skip-first-steps", type=int, default=d.skip_first_steps)
    rep.add_argument("--no-plots", action="store_true")
    rep.add_argument("--no-sacct", action="store_true")
    rep.add_argument("--no-export", action="store_true", help="skip the CSV and trace exports")
    rep.add_argument(
        "--stream",
        choices=("auto", "on", "off"),
        default=d.stream,
        help="read through per-node summaries cached beside the node files (auto: above "
        "--stream-above-mb of node files)",
    )
    rep.add_argument("--stream-above-mb", type=float, default=d.stream_above_mb)
    cmp = sub.add_parser("compare", help="two runs side by side, with run-to-run noise")
    cmp.add_argument("run_a", type=Path)
    cmp.add_argument("run_b", type=Path)
    cmp.add_argument("--json", type=Path, default=None, help="also write the comparison here")
    watch = sub.add_parser("watch", help="live view of a running job's telemetry")
    watch.add_argument("run_dir", type=Path)
    watch.add_argument("--once", action="store_true", help="print one snapshot and exit")
    watch.add_argument("--refresh-s", type=float, default=2.0)
    return parser.parse_args(argv)


def report_config(args: argparse.Namespace) -> ReportConfig:
    return ReportConfig(
        straggler_margin=args.straggler_margin,
        straggler_persistence=args.straggler_persistence,
        straggler_metric=args.straggler_metric,
        idle_gap_min_s=args.idle_gap_min_s,
        idle_gap_factor=args.idle_gap_factor,
        skip_first_steps=args.skip_first_steps,
        plots=not args.no_plots,
        sacct=not args.no_sacct,
        export=not args.no_export,
        stream=args.stream,
        stream_above_mb=args.stream_above_mb,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "report":
            from toolkit.telemetry.report.build import build_report
            from toolkit.telemetry.report.tables import print_report

            report = build_report(args.run_dir, args.out, report_config(args))
            print_report(report)
            print(f"report: {report.outputs['html']} ({report.elapsed_s:.1f} s)")
            return 0
        if args.command == "compare":
            import json

            from toolkit.telemetry.compare import compare, print_comparison

            result = compare(args.run_a, args.run_b)
            print_comparison(result)
            if args.json is not None:
                args.json.write_text(json.dumps(result, indent=2, default=str))
            return 0
        from toolkit.telemetry.watch import watch

        if args.refresh_s <= 0:
            raise ConfigError(f"--refresh-s={args.refresh_s}: must be > 0 seconds")
        return watch(args.run_dir, once=args.once, refresh_s=args.refresh_s)
    except (NoTelemetry, ConfigError) as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a full disk under --out: one line, not a traceback
        where = exc.filename or getattr(args, "out", None) or args.run_dir
        print(
            f"error: {where}: {exc.strerror or exc}; free space there or write elsewhere (--out DIR)",
            file=sys.stderr,
        )
        return 1
