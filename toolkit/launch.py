"""`python -m toolkit.launch [-m] [--cfg job] [OVERRIDE ...]`: compose, validate, prepare the
run directories, pick the executor, submit, follow. `--compose` is the batch-script side:
prepare the run dir for the allocation the script runs in and print its path.

Configuration is composed by Hydra from conf/ (every group backed by a dataclass schema);
`-m` expands sweep overrides (`model=a,b trainer.micro_batch_size=2,4`) with Hydra's own
parser into one run per combination, all handed to the executor at once (one Slurm array).
Bad input exits 2 before any rank starts, one line per problem.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from omegaconf import OmegaConf

from toolkit.config.cluster import check_run_dir
from toolkit.config.compose import compose_raw, job_to_dict, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.validate import RuntimeCheck, validate
from toolkit.data.manifest import DataError
from toolkit.executors import PreparedRun, get_executor
from toolkit.nccl.checks import check_job as nccl_problems
from toolkit.redact import redact
from toolkit.tasks import task_problems

# Checks that need the runtime's knowledge (task names, NCCL's variables), beside the
# config groups' own problems().
RUNTIME_CHECKS: list[RuntimeCheck] = [task_problems, nccl_problems]

USAGE = """python -m toolkit.launch [-m] [--cfg job] [OVERRIDE ...]
       python -m toolkit.launch --compose [OVERRIDE ...]   (inside a batch script)

  OVERRIDE   Hydra override: group=option (model=gpt_125m), key=value (trainer.steps=50),
             +key=value to add, hydra.run.dir=PATH for the run directory.
  -m         multirun: comma-separated values sweep (model=gpt_tiny,gpt_small).
  --cfg job  print the resolved job config and exit.
  --compose  in an sbatch script (jobs/train.sbatch): prepare the run dir for this
             allocation (a requeued job gets its own back), print its path.
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolkit.launch", usage=USAGE, add_help=True)
    parser.add_argument("-m", "--multirun", action="store_true")
    parser.add_argument("--cfg", choices=["job", "hydra", "all"], default=None)
    parser.add_argument("--compose", action="store_true")
    parser.add_argument("overrides", nargs="*")
    return parser.parse_intermixed_args(argv)


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # noqa: BLE001 - Hydra raises its own parse errors
        raise ConfigError(f"cannot parse overrides: {str(exc).splitlines()[0]}") from None
    batches = BasicSweeper.split_arguments(parsed, None)
    return [combo for batch in batches for combo in batch]


def prepare(overrides_list: list[list[str]], multirun: bool) -> tuple[list[PreparedRun], list]:
    runs: list[PreparedRun] = []
    cfgs = []
    sweep_dir: Path | None = None
    for index, overrides in enumerate(overrides_list):
        cfg = compose_raw(overrides)
        job = to_job(cfg)
        if multirun:
            if sweep_dir is None:
                sweep_dir = Path(str(cfg.hydra.sweep.dir)).resolve()
            run_dir = sweep_dir / str(index)
        else:
            run_dir = Path(str(cfg.hydra.run.dir)).resolve()
        job.run_dir = str(run_dir)
        check_run_dir(job.run_dir, multirun)
        validate(job, RUNTIME_CHECKS)
        runs.append(PreparedRun(job=job, run_dir=run_dir, overrides=overrides))
        cfgs.append(cfg)
    return runs, cfgs


def write_run_dir(run: PreparedRun, choices: dict) -> None:
    """config.yaml is what every rank reads back and runs: it keeps every value, secrets
    included, and is private to the user (the run dir 0700, the file 0600). launch.yaml
    records the command line, redacted."""
    run.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    run.run_dir.chmod(0o700)
    config = OmegaConf.create(job_to_dict(run.job))
    _save_private(OmegaConf.to_yaml(config), run.run_dir / "config.yaml")
    record = OmegaConf.create({"overrides": redact(run.overrides), "choices": choices})
    _save_private(OmegaConf.to_yaml(record), run.run_dir / "launch.yaml")


def _save_private(text: str, path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when the file was there already
    with os.fdopen(fd, "w") as f:
        f.write(text)


def prepare_in_allocation(overrides: list[str], environ: dict[str, str]) -> Path:
    """Inside a Slurm batch script (jobs/train.sbatch): compose the job for the allocation it
    runs in, prepare its run dir once and return it; a requeued job gets its own back.

    The allocation decides the shape (its overrides come last). Without hydra.run.dir the
    run dir is outputs/slurm/<job id> under the submit dir, so that a requeue finds it.
    """
    from toolkit.distributed.env import slurm_job_label
    from toolkit.train.data_files import prepare as prepare_data

    nodes = int(environ["SLURM_JOB_NUM_NODES"])
    tasks = int(environ["SLURM_NTASKS"]) // nodes
    shape = ["cluster=slurm", f"cluster.nodes={nodes}", f"cluster.tasks_per_node={tasks}"]
    user_dir = any(o.lstrip("+").startswith("hydra.run.dir=") for o in overrides)
    submit_dir = Path(environ.get("SLURM_SUBMIT_DIR", "."))
    default_dir = submit_dir / "outputs" / "slurm" / slurm_job_label(environ)
    # cluster=slurm selects the group option; a user's cluster.* overrides still apply after it.
    all_overrides = [o for o in overrides if not o.startswith("cluster=")]
    all_overrides = shape[:1] + all_overrides + shape[1:]
    if not user_dir:
        all_overrides.append(f"hydra.run.dir={default_dir}")
    runs, cfgs = prepare([all_overrides], multirun=False)
    run = runs[0]
    if (run.run_dir / "config.yaml").exists():
        return run.run_dir  # requeued: keep the config (and checkpoints) of the first start
    choices = OmegaConf.to_container(cfgs[0].hydra.runtime.choices)
    write_run_dir(run, choices)
    prepare_data(run.job.data, run.job.model.num_series, run.job.model.num_targets)
    return run.run_dir


def compose_in_allocation(overrides: list[str]) -> int:
    """`--compose OVERRIDE...`: in a batch script, prepare the run dir and print its path."""
    try:
        run_dir = prepare_in_allocation(overrides, dict(os.environ))
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(run_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.compose:
        return compose_in_allocation(args.overrides)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs, cfgs = prepare(expand(args.overrides, args.multirun), args.multirun)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    if args.cfg:
        for run, cfg in zip(runs, cfgs, strict=True):
            if args.cfg in ("hydra", "all"):
                print(OmegaConf.to_yaml(cfg.hydra))
            if args.cfg in ("job", "all"):
                print(OmegaConf.to_yaml(OmegaConf.create(job_to_dict(run.job))))
        return 0

    from toolkit.train.data_files import prepare as prepare_data

    for run, cfg in zip(runs, cfgs, strict=True):
        choices = (
            OmegaConf.to_container(cfg.hydra.runtime.choices) if "runtime" in cfg.hydra else {}
        )
        if not run.job.launch.dry_run:
            try:  # once, before any rank starts: a bad dataset fails here, in one line
                prepare_data(run.job.data, run.job.model.num_series, run.job.model.num_targets)
            except DataError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            write_run_dir(run, choices)
    kinds = {run.job.cluster.kind for run in runs}
    if len(kinds) != 1:
        print(
            f"error: cluster: one sweep must use one executor, got {sorted(kinds)}", file=sys.stderr
        )
        return 2
    try:
        return get_executor(kinds.pop()).run(runs)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
