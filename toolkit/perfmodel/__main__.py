"""`python -m toolkit.perfmodel [-cd DIR] [--json] [--world N] [OVERRIDE ...]`: predict a configuration.

Composes the same Hydra config as the launcher (so `model=gpt_1b precision=bf16 hardware=h100
cluster.tasks_per_node=8` means the same here), prints the prediction table, or one JSON
object with --json.
"""

from __future__ import annotations

import argparse
import json
import sys

from toolkit.config.compose import job_or_none
from toolkit.config.model import display_name
from toolkit.config.sources import add_config_dir_option
from toolkit.perfmodel.job import layout_problems, predict_job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.perfmodel")
    add_config_dir_option(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--world", type=int, default=None, help="world size (default: cluster)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    job = job_or_none(args.overrides, args.config_dir)
    if job is None:
        return 2
    if args.world is not None and args.world < 1:
        print(f"error: --world={args.world}: must be >= 1", file=sys.stderr)
        return 2
    refused = layout_problems(job, args.world)
    for line in refused:
        print(f"error: {line}", file=sys.stderr)
    if refused:
        return 2
    from toolkit.perfmodel.count_job import counted_shape_or_none  # torch: a model of yours

    try:
        prediction = predict_job(job, args.world, counted_shape_or_none(job))
    except ValueError as exc:  # the mesh's degrees do not multiply to --world
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(prediction.as_dict()))
        return 0
    from rich.console import Console

    from toolkit.perfmodel.report import prediction_table

    title = (
        f"{display_name(job.model)}, {prediction.world_size} ranks, {job.precision.name}, "
        f"{job.hardware.name}: performance model"
    )
    Console().print(prediction_table(prediction, title=title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
