"""`python -m toolkit.data prepare SRC OUT [--format hdf5|parquet|npy] [--chunk-len N]
[--nonfinite refuse|mask] [--layout series]`,
`python -m toolkit.data inspect OUT`, `python -m toolkit.data synthetic OUT [--times T]
[--instruments N] [--format F]`. A bad input is one line on stderr and exit status 1."""

from __future__ import annotations

import argparse
import sys

from toolkit.data.manifest import FORMATS, DataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.data")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="convert CSV/Parquet/NumPy files into a dataset")
    prep.add_argument("src")
    prep.add_argument("out")
    prep.add_argument("--format", choices=FORMATS, default="hdf5")
    prep.add_argument("--chunk-len", type=int, default=None, help="time steps per chunk")
    prep.add_argument("--time-column", default="time")
    prep.add_argument("--instrument-column", default="instrument")
    prep.add_argument(
        "--nonfinite",
        choices=("refuse", "mask"),
        default="refuse",
        help="an infinite value in the source: refuse it (default) or treat it as missing",
    )
    prep.add_argument(
        "--layout",
        choices=["series"],
        default=None,
        help="a 3-D .npy is [time, instrument, feature] series (required for one)",
    )
    insp = sub.add_parser("inspect", help="shapes, ranges, missing values, statistics")
    insp.add_argument("out")
    syn = sub.add_parser("synthetic", help="write the synthetic factor-model market")
    syn.add_argument("out")
    syn.add_argument("--times", type=int, default=20_000)
    syn.add_argument("--instruments", type=int, default=16)
    syn.add_argument("--format", choices=FORMATS, default="hdf5")
    syn.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "prepare":
            from toolkit.data.prepare import prepare

            m = prepare(
                args.src,
                args.out,
                args.format,
                args.chunk_len,
                args.time_column,
                args.instrument_column,
                args.nonfinite,
                args.layout,
            )
            print(f"wrote {args.out}: {m.format}, shape {m.shape}, chunk {m.chunk}")
        elif args.command == "synthetic":
            from toolkit.data.synthetic import write_synthetic

            m = write_synthetic(args.out, args.times, args.instruments, args.format, args.seed)
            print(f"wrote {args.out}: {m.format}, shape {m.shape}, chunk {m.chunk}")
        else:
            from toolkit.data.inspect import format_summary, summary

            print(format_summary(args.out, summary(args.out)))
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
