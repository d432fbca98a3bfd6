"""`python -m toolkit.perfmodel [-cd DIR] [--json] [--world N] [OVERRIDE ...]`: predict a configuration.
`python -m toolkit.perfmodel --run RUN_DIR [--json] [--world N]`: predict a run as it ran.

Composes the same Hydra config as the launcher (so `model=gpt_1b precision=bf16 hardware=h100
cluster.tasks_per_node=8` means the same here), prints the prediction table, or one JSON
object with --json. A model of your own is counted on meta tensors from your config.

--run reads a run directory as data: its config.yaml's values and the model the run recorded
(RUN/model.json); nothing it names is imported or built, and the working directory is taken
off sys.path (`toolkit perfmodel --run` or `python -P -m toolkit.perfmodel --run` keep a
planted package out of the imports before that). A samples model's rate is samples/s.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and any(a.split("=")[0] == "--run" for a in sys.argv[1:]):
    from toolkit.readonly import drop_working_dir

    drop_working_dir()

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from toolkit.config.compose import job_or_none  # noqa: E402
from toolkit.config.model import display_name  # noqa: E402
from toolkit.config.sources import add_config_dir_option  # noqa: E402
from toolkit.perfmodel.job import layout_problems, predict_job  # noqa: E402
from toolkit.perfmodel.regime import add_bench_data_option, read_bench_data, regime  # noqa: E402


def run_job(run_dir: Path) -> tuple[Any, Any, str]:
    """(the run's JobConfig, what predict_job's `counted` takes, '') from a run directory's
    config.yaml and model.json as plain data; (None, None, why) when it cannot be predicted."""
    from toolkit.config.compose import load_job
    from toolkit.config.model import TransformerConfig
    from toolkit.perfmodel.count_job import shape_of_run_model
    from toolkit.runmodel import run_model_or_note

    try:  # plain values: a `_target_` there is a string, never imported
        job = load_job(run_dir / "config.yaml")
    except Exception as exc:  # noqa: BLE001 - YAML, OmegaConf and schema errors alike
        return None, None, f"{run_dir / 'config.yaml'}: unreadable ({type(exc).__name__})"
    if isinstance(job.model, TransformerConfig):
        return job, None, ""  # the analytic terms: arithmetic over the shape's numbers
    recorded, why = run_model_or_note(run_dir)
    if recorded is None:
        return None, None, f"{run_dir}: {why}"
    return job, shape_of_run_model(recorded), ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.perfmodel")
    add_config_dir_option(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--world", type=int, default=None, help="world size (default: cluster)")
    parser.add_argument(
        "--run", type=Path, default=None, metavar="RUN_DIR", help="predict a run as it ran"
    )
    add_bench_data_option(parser)  # the small-model regime's data paths (regime.py)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.run is not None and (args.overrides or args.config_dir):
        print("error: --run RUN_DIR: predicts the run as it ran; no overrides", file=sys.stderr)
        return 2
    if args.run is not None:
        job, counted, why = run_job(args.run)
        if job is None:
            print(f"error: {why}", file=sys.stderr)
            return 2
    else:
        job = job_or_none(args.overrides, args.config_dir)
        counted = None
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
    if args.run is None:
        from toolkit.perfmodel.count_job import counted_shape_or_none  # torch: a model of yours

        counted = counted_shape_or_none(job)
    try:
        prediction = predict_job(job, args.world, counted)
    except ValueError as exc:  # the mesh's degrees do not multiply to --world
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from toolkit.perfmodel.count_job import predicted_rate

    unit, rate = predicted_rate(prediction, counted or job.model, job.data.seq_len)
    try:  # launch floor, packing, data paths, advice (None: a model without counted launches)
        small = regime(job, args.world, counted, read_bench_data(args.bench_data))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        peak = job.hardware.peak_flops(job.precision.param_dtype)
        rates = {"unit": unit, f"{unit}_per_s": rate}
        regime_json = {"regime": small.as_dict() if small else None}
        print(
            json.dumps(
                {**prediction.as_dict(), **rates, **prediction.utilisation(peak), **regime_json}
            )
        )
        return 0
    from rich.console import Console
    from rich.table import Table

    from toolkit.perfmodel.report import prediction_rows

    title = (
        f"{display_name(job.model)}, {prediction.world_size} ranks, {job.precision.name}, "
        f"{job.hardware.name}: performance model"
    )
    table = Table(title=title)
    table.add_column("quantity")
    table.add_column("predicted", justify="right")
    for name, predicted, key in prediction_rows(prediction):
        if key == "tokens_per_s":  # the model's own unit
            name, predicted = f"{unit}/s (all ranks)", f"{rate:,.0f}"
        table.add_row(name, predicted)
    Console().print(table)
    for line in small.lines if small else []:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
