"""`python -m toolkit.launch [-m] [-cd DIR] [--cfg job] [OVERRIDE ...]` (also `toolkit launch`):
compose, validate, prepare the
run directories, pick the executor, submit, follow. `--compose` is the batch-script side:
prepare the run dir for the allocation the script runs in and print its path.

Configuration is composed by Hydra from conf/ (every group backed by a dataclass schema);
`-m` expands sweep overrides (`model=a,b trainer.micro_batch_size=2,4`) with Hydra's own
parser into one run per combination, all handed to the executor at once (one Slurm array).
Bad input exits 2 before any rank starts, one line per problem.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from toolkit import pack
from toolkit.config import hydra_tools, sources
from toolkit.config.cluster import check_run_dir
from toolkit.config.compose import compose_raw, job_to_dict, open_dict_overrides, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.help import group_help, help_topics, launch_help
from toolkit.config.hydra_tools import INFO_CHOICES
from toolkit.config.model import series_shape
from toolkit.config.validate import RuntimeCheck, validate
from toolkit.data.manifest import DataError
from toolkit.executors import PreparedRun, get_executor, rundir_lock
from toolkit.files import write_private
from toolkit.kernels.checks import kernel_problems
from toolkit.nccl.checks import check_job as nccl_problems
from toolkit.perfmodel.checks import memory_problems
from toolkit.redact import redact
from toolkit.tasks import task_problems
from toolkit.train.model_checks import model_problems
from toolkit.train.targets import callback_problems, dataset_import_problems, optimizer_problems

# Checks that need the runtime's knowledge (task names, NCCL's variables, which kernels can
# run where the ranks run, whether your own optimizer and callbacks import, whether the
# job fits the devices' memory), beside the config groups' own problems().
RUNTIME_CHECKS: list[RuntimeCheck] = [
    task_problems,
    nccl_problems,
    kernel_problems,
    optimizer_problems,
    callback_problems,
    dataset_import_problems,
    model_problems,
    memory_problems,
]

USAGE = (
    "python -m toolkit.launch [-m] [-cd DIR] [--cfg job|hydra|all] [--help [GROUP]] [OVERRIDE ...]"
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    # `--help`/`--info` take an optional word; one that is not theirs is an override.
    if args.help not in (None, "", *help_topics()):
        args.overrides.insert(0, args.help)
        args.help = ""
    if args.info is not None and args.info not in INFO_CHOICES:
        args.overrides.insert(0, args.info)
        args.info = "all"
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m toolkit.launch", usage=USAGE, add_help=False)
    parser.add_argument(
        "-h",
        "--help",
        nargs="?",
        const="",
        default=None,
        metavar="GROUP",
        help="groups, options, fields",
    )
    parser.add_argument("-m", "--multirun", action="store_true", help="sweep: one run each")
    sources.add_config_dir_option(parser)
    parser.add_argument("--cfg", choices=["job", "hydra", "all"], default=None, help="print it")
    parser.add_argument("--package", "-p", default=None, help="with --cfg: print one subtree")
    parser.add_argument("--resolve", action="store_true", help="with --cfg: resolve ${...}")
    parser.add_argument("--info", "-i", nargs="?", const="all", default=None, help="Hydra info")
    parser.add_argument("--shell-completion", "-sc", action="store_true", help="install=bash")
    parser.add_argument("--hydra-help", action="store_true", help="Hydra's help")
    parser.add_argument("--compose", action="store_true", help="in a batch script")
    parser.add_argument("overrides", nargs="*", help="group=option or key=value")
    return parser


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


def prepare(
    overrides_list: list[list[str]], multirun: bool, config_dirs: Sequence[str] = ()
) -> tuple[list[PreparedRun], list]:
    runs: list[PreparedRun] = []
    cfgs = []
    sweep_dir: Path | None = None
    for index, overrides in enumerate(overrides_list):
        cfg = compose_raw(overrides, config_dirs)
        if multirun:
            if sweep_dir is None:
                sweep_dir = Path(str(cfg.hydra.sweep.dir)).resolve()
            run_dir = sweep_dir / str(index)
        else:
            run_dir = Path(str(cfg.hydra.run.dir)).resolve()
        runs.append(prepared(cfg, overrides, run_dir, multirun))
        cfgs.append(cfg)
    return runs, cfgs


def prepared(cfg, overrides: list[str], run_dir: Path, multirun: bool) -> PreparedRun:
    """The composed config as a validated job that runs in `run_dir`."""
    job = to_job(cfg)
    job.run_dir = str(run_dir)
    check_run_dir(job.run_dir, multirun)
    validate(job, RUNTIME_CHECKS)
    return PreparedRun(job=job, run_dir=run_dir, overrides=overrides)


@dataclass
class Packing:
    """A -m sweep packed into ensembles (launch.pack=auto): what runs, and for each run
    that became a member, the pointer file its own run dir gets."""

    runs: list[PreparedRun]
    cfgs: list
    table: list[str]  # which run went where (toolkit.pack.pack_table)
    pointers: dict[Path, dict]  # SWEEP/<index>/packed.json -> its content


def pack_sweep(
    runs: list[PreparedRun], cfgs: list, config_dirs: Sequence[str] = ()
) -> Packing | None:
    """The sweep's runs grouped into packs (toolkit.pack.group); each pack of several runs
    becomes one job in SWEEP/pack<i> with trainer.ensemble and trainer.members, composed
    and validated as any job; a run of its own keeps its run dir. None when the sweep does
    not ask for packing."""
    if not any(r.job.launch.pack == "auto" for r in runs):
        return None
    from toolkit.config.trainer import PACKABLE

    sweep = [
        pack.SweepRun(i, r.overrides, job_to_dict(r.job), pack.not_packable(r.job))
        for i, r in enumerate(runs)
    ]
    packs = pack.group(sweep, PACKABLE)
    sweep_dir = runs[0].run_dir.parent
    out = Packing([], [], [], {})
    names: list[str] = []
    packed = 0
    for p in packs:
        first = p.runs[0].index
        if not p.packed:  # a run of its own: as without packing
            out.runs.append(runs[first])
            out.cfgs.append(cfgs[first])
            names.append(runs[first].run_dir.name)
            continue
        overrides = [*runs[first].overrides, *p.ensemble_overrides()]
        run_dir, packed = sweep_dir / f"pack{packed}", packed + 1
        out.runs.append(prepared(compose_raw(overrides, config_dirs), overrides, run_dir, True))
        out.cfgs.append(cfgs[first])
        names.append(run_dir.name)
        for run, member in zip(p.runs, p.members, strict=True):
            out.pointers[runs[run.index].run_dir / pack.POINTER] = pack.pointer(
                run.overrides, run_dir, member["name"], p.data_seed, p.equals(run)
            )
    out.table = pack.pack_table(packs, names)
    return out


# Folders of the run dir that the ranks, the node agent or a tracker create when they need
# them (logs/ and metrics/ the launcher creates itself).
RANK_DIRS = ("checkpoints", "nccl", "telemetry", "tracking", "bench")


def write_run_dir(run: PreparedRun, choices: dict, config_dirs: Sequence[str] = ()) -> None:
    """config.yaml is what every rank reads back and runs: it keeps every value, secrets
    included, and is private to the user (the run dir 0700, the file 0600). launch.yaml
    records the command line (redacted) and the file each option came from."""
    run.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    run.run_dir.chmod(0o700)
    for sub in ("logs", "metrics"):  # a file in the way: one line here, not one per rank
        (run.run_dir / sub).mkdir(exist_ok=True)
    for sub in RANK_DIRS:  # made by the ranks when needed: a file there fails here, once
        path = run.run_dir / sub
        if (path.is_symlink() or path.exists()) and not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    config = OmegaConf.create(job_to_dict(run.job))
    write_private(run.run_dir / "config.yaml", OmegaConf.to_yaml(config))
    dirs = sources.search_dirs(config_dirs)
    record = {
        "overrides": redact(run.overrides),
        "choices": choices,
        "sources": sources.sources_of(choices, dirs),
        "config_dirs": [str(d.path) for d in dirs],
    }
    write_private(run.run_dir / "launch.yaml", OmegaConf.to_yaml(OmegaConf.create(record)))


def claim_run_dir(run: PreparedRun) -> None:
    """One writer per run dir (toolkit.executors.rundir_lock): a local run holds the lock
    until its last rank ends; a Slurm launch is refused while the job recorded there lives."""
    if run.job.cluster.kind == "slurm":
        rundir_lock.check_slurm(run.run_dir, rundir_lock.slurm_state)
    else:
        rundir_lock.acquire(run.run_dir, rundir_lock.slurm_state)


def run_dir_error(run_dir: Path, exc: OSError) -> str:
    """One line for a run dir the launcher cannot create or write."""
    where = exc.filename or run_dir
    return (
        f"cannot write the run dir {run_dir}: {where}: {exc.strerror or exc}; "
        "choose a writable hydra.run.dir (and remove any file in the way)"
    )


def choices_of(cfg) -> dict:
    """group -> chosen option, as Hydra recorded it."""
    return OmegaConf.to_container(cfg.hydra.runtime.choices) if "runtime" in cfg.hydra else {}


def print_cfg(args: argparse.Namespace, runs: list[PreparedRun], cfgs: list) -> int:
    """`--cfg job|hydra|all [--package KEY] [--resolve]`, as Hydra prints them; the job part is
    the validated, typed job (always resolved), headed by the file each option came from."""
    dirs = sources.search_dirs(args.config_dir)
    for run, cfg in zip(runs, cfgs, strict=True):
        tree = OmegaConf.create({})
        if args.cfg in ("hydra", "all"):
            tree.hydra = cfg.hydra
        if args.cfg in ("job", "all"):
            tree = OmegaConf.merge(OmegaConf.create(job_to_dict(run.job)), tree)
        if args.package not in (None, "_global_"):
            selected = OmegaConf.select(tree, args.package)
            if selected is None:
                print(f"error: --package {args.package}: not found in the config", file=sys.stderr)
                return 2
            if not OmegaConf.is_config(selected):
                print(selected)
                continue
            print(f"# @package {args.package}")
            tree = selected
        if args.resolve:
            OmegaConf.resolve(tree)
        if args.cfg in ("job", "all") and args.package in (None, "_global_"):
            for group, path in sources.sources_of(choices_of(cfg), dirs).items():
                print(f"# {group}: {path}")
        print(OmegaConf.to_yaml(tree))
    return 0


def prepare_in_allocation(
    overrides: list[str], environ: dict[str, str], config_dirs: Sequence[str] = ()
) -> Path:
    """Inside a Slurm batch script (jobs/train.sbatch): compose the job for the allocation it
    runs in, prepare its run dir once and return it; a requeued job gets its own back.

    The allocation decides the shape (its overrides come last). Without hydra.run.dir the
    run dir is outputs/slurm/<job id> under the submit dir, so that a requeue finds it.
    """
    from toolkit.data.files import prepare as prepare_data
    from toolkit.distributed.env import slurm_job_label

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
    runs, cfgs = prepare([all_overrides], multirun=False, config_dirs=config_dirs)
    run = runs[0]
    own_id = slurm_job_label(environ)
    # This job holds the run dir across its requeues; another live job there is refused.
    rundir_lock.check_slurm(
        run.run_dir, lambda j: None if j == own_id else rundir_lock.slurm_state(j)
    )
    rundir_lock.record_slurm(run.run_dir, own_id or None)
    if (run.run_dir / "config.yaml").exists():
        return run.run_dir  # requeued: keep the config (and checkpoints) of the first start
    write_run_dir(run, choices_of(cfgs[0]), config_dirs)
    if not run.job.script.enabled:  # your own script reads its own data
        prepare_data(run.job.data, *series_shape(run.job.model))
    return run.run_dir


def compose_in_allocation(overrides: list[str], config_dirs: Sequence[str] = ()) -> int:
    """`--compose OVERRIDE...`: in a batch script, prepare the run dir and print its path."""
    try:
        run_dir = prepare_in_allocation(overrides, dict(os.environ), config_dirs)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except (DataError, rundir_lock.RunDirBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {run_dir_error(Path(exc.filename or '.'), exc)}", file=sys.stderr)
        return 2
    print(run_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        done = informational(args)
    except (ConfigError, FileNotFoundError) as exc:
        for line in getattr(exc, "problems", [str(exc)]):
            print(f"error: {line}", file=sys.stderr)
        return 2
    if done is not None:
        return done
    if args.compose:
        return compose_in_allocation(args.overrides, args.config_dir)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs, cfgs = prepare(
                expand(args.overrides, args.multirun), args.multirun, args.config_dir
            )
            packing = pack_sweep(runs, cfgs, args.config_dir) if args.multirun else None
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    if not args.multirun and runs[0].job.launch.pack == "auto":
        print(
            "warning: launch.pack=auto: only a -m sweep is packed; this run is one", file=sys.stderr
        )
    if packing is not None:
        runs, cfgs = packing.runs, packing.cfgs
    if args.cfg:
        return print_cfg(args, runs, cfgs)
    if packing is not None:
        print(f"launch.pack=auto: {len(runs)} job(s) for the sweep's runs", flush=True)
        print("\n".join(packing.table), flush=True)

    from toolkit.data.files import prepare as prepare_data

    for run, cfg in zip(runs, cfgs, strict=True):
        if not run.job.launch.dry_run:
            try:  # once, before any rank starts: a bad dataset fails here, in one line
                if not run.job.script.enabled:  # your own script reads its own data
                    prepare_data(run.job.data, *series_shape(run.job.model))
            except DataError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            try:  # one writer per run dir, and a run dir that cannot be written: one line
                claim_run_dir(run)
                write_run_dir(run, choices_of(cfg), args.config_dir)
            except rundir_lock.RunDirBusy as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            except OSError as exc:
                print(f"error: {run_dir_error(run.run_dir, exc)}", file=sys.stderr)
                return 2
    if packing is not None and not runs[0].job.launch.dry_run:
        for path, record in packing.pointers.items():
            try:  # each packed run's own dir says where its results are
                write_private(path, json.dumps(record, indent=2) + "\n")
            except OSError as exc:
                print(f"error: {run_dir_error(path.parent, exc)}", file=sys.stderr)
                return 2
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


def informational(args: argparse.Namespace) -> int | None:
    """--help [GROUP], --hydra-help, --info, --shell-completion: print, and return 0; None
    when the command is none of them."""
    if args.help is not None:
        dirs = sources.search_dirs(args.config_dir)
        print(group_help(args.help, dirs) if args.help else launch_help(dirs), end="")
        return 0
    if args.hydra_help:
        hydra_tools.hydra_help(build_parser(), args.overrides)
        return 0
    if args.info is not None:
        hydra_tools.show_info(args.info, open_dict_overrides(args.overrides), args.config_dir)
        return 0
    if args.shell_completion:
        hydra_tools.shell_completion(args.overrides, args.config_dir)
        return 0
    if args.resolve and args.cfg is None:
        raise ConfigError("--resolve: only with --cfg (as in Hydra)")
    return None


if __name__ == "__main__":
    sys.exit(main())
