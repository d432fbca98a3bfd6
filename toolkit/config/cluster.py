"""Where the job runs: local processes or a Slurm allocation (fields mirror sbatch)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from toolkit.config.errors import (
    ConfigError,
    below_minimum,
    control_characters,
    control_problem,
    shown,
)

# sbatch --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}")
_MEM = re.compile(r"\d+[KMGT]?B?", re.IGNORECASE)
_SBATCH_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=.+)?")
# What Slurm accepts in the single-token fields (ASCII only; no spaces, quotes or shell syntax).
# Partitions, accounts, QOS: names, comma-separated where sbatch takes several.
_NAMES = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
# Node features joined by & | and ',' with [] () and *count, e.g. "a100&ib" or "[r1|r2]*2".
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.\-&|,\[\]()*!:]+")
# Host lists, e.g. "node[01-04,07],gpu3".
_HOSTLIST = re.compile(r"[A-Za-z0-9_.\-,\[\]]+")
_TOKENS = {
    "partition": (_NAMES, "a partition name (or several, comma-separated)"),
    "account": (_NAMES, "an account name"),
    "qos": (_NAMES, "a QOS name (or several, comma-separated)"),
    "constraint": (_CONSTRAINT, "node features joined by & | or ',' (e.g. a100&ib)"),
    "exclude": (_HOSTLIST, "a host list (e.g. node[01-04],gpu3)"),
}
_SRUN_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[^\s\x00-\x1f\x7f]+)?")


@dataclass
class ClusterConfig:
    """Executor and resources. ``kind=local`` starts ranks as local processes;
    ``kind=slurm`` submits through submitit (the sbatch-like fields apply there)."""

    kind: str = "local"  # local | slurm
    nodes: int = 1
    # Ranks per node. None: one per GPU when GPUs are present, else 2 locally / 1 on Slurm.
    tasks_per_node: int | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None  # e.g. "64G"; None: the partition's default
    time: str = "01:00:00"  # sbatch --time
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    exclusive: bool = False
    requeue: bool = True  # sbatch --requeue (else --no-requeue)
    signal: str = "USR2"  # sent signal_lead_s before the time limit
    signal_lead_s: int = 120
    job_name: str = "toolkit"
    # Extra sbatch options, e.g. "--reservation=x" or "--mail-type=END" ("#SBATCH " optional).
    sbatch_extra: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)  # shell lines run before srun (module load, ...)
    # Extra srun options for every task, e.g. Pyxis "--container-image=nvcr.io#nvidia/pytorch:24.05-py3"
    # and "--container-mounts=/data:/data" (long options only; no spaces or control characters).
    srun_extra: list[str] = field(default_factory=list)
    array_parallelism: int = 8  # cap on concurrently running array elements (multirun)
    master_port: int | None = None  # None: a free port locally, derived from the job id on Slurm
    python: str | None = None  # interpreter on the nodes; None: the launcher's own (sys.executable)

    KINDS = ("local", "slurm")


def parse_sbatch_extra(lines: list[str]) -> dict[str, str | bool]:
    """`["--reservation=x", "#SBATCH --exclusive"]` -> {"reservation": "x", "exclusive": True}."""
    options: dict[str, str | bool] = {}
    for line in lines:
        text = line.strip().removeprefix("#SBATCH").strip()
        name, sep, value = text.removeprefix("--").partition("=")
        options[name] = value if sep else True
    return options


def script_text_problems(c: ClusterConfig) -> list[str]:
    """Every string that ends up in the sbatch script or the srun line, checked as text:
    a control character (a newline above all) would let a value write its own `#SBATCH` or
    shell line, so it is refused; the single-token fields hold only what Slurm accepts."""
    p = []
    texts = {
        name: getattr(c, name)
        for name in ("partition", "account", "qos", "constraint", "exclude", "job_name")
        + ("mem", "time", "signal", "python")
    }
    texts |= {f"sbatch_extra[{i}]": line for i, line in enumerate(c.sbatch_extra)}
    texts |= {f"setup[{i}]": line for i, line in enumerate(c.setup)}
    for name, value in texts.items():
        if value is not None:
            p += control_problem(f"cluster.{name}", str(value))
    for name, (pattern, allowed) in _TOKENS.items():
        value = getattr(c, name)
        if value is None or control_characters(value):  # reported above
            continue
        if not pattern.fullmatch(value):
            p.append(
                f"cluster.{name}={value}: not what Slurm accepts here; use {allowed}, "
                "ASCII letters, digits, '_', '.' and '-'"
            )
    return p


def run_dir_problems(run_dir: str, multirun: bool = False) -> list[str]:
    """The run dir is written into the sbatch script (log paths, the srun line) and into
    config.yaml: no control characters in it."""
    return control_problem("hydra.sweep.dir" if multirun else "hydra.run.dir", run_dir)


def check_run_dir(run_dir: str, multirun: bool = False) -> None:
    """Raise ConfigError when `run_dir_problems` finds any (for the launcher)."""
    if problems := run_dir_problems(run_dir, multirun):
        raise ConfigError(problems)


def slurm_problems(c: ClusterConfig) -> list[str]:
    """Checks of the sbatch-like fields; one line per problem (field, value, what is allowed)."""
    p = script_text_problems(c)
    bad = {line.split("=", 1)[0] for line in p}  # reported already: one line per problem
    if "cluster.time" not in bad and not _TIME.fullmatch(c.time):
        p.append(
            f"cluster.time={c.time}: not an sbatch time; use M, H:M:S or D-H:M:S (e.g. 01:00:00)"
        )
    if c.mem is not None and "cluster.mem" not in bad and not _MEM.fullmatch(c.mem):
        p.append(f"cluster.mem={c.mem}: not an sbatch memory size; use e.g. 64G or 4000M")
    if c.cpus_per_task is not None and c.cpus_per_task < 1:
        p.append(f"cluster.cpus_per_task={c.cpus_per_task}: must be >= 1 (or null)")
    if "cluster.signal" not in bad and not re.fullmatch(r"(SIG)?[A-Z0-9]+", c.signal):
        p.append(f"cluster.signal={c.signal}: not a signal name; use e.g. USR2, USR1 or TERM")
    if "cluster.job_name" not in bad and not re.fullmatch(r"[\w.-]+", c.job_name, re.ASCII):
        p.append(f"cluster.job_name={c.job_name}: use letters, digits, '.', '_' and '-' only")
    if c.master_port is not None and not 1024 <= c.master_port <= 65535:
        p.append(f"cluster.master_port={c.master_port}: must be in 1024..65535 (or null)")
    for i, line in enumerate(c.sbatch_extra):
        text = line.strip().removeprefix("#SBATCH").strip()
        if f"cluster.sbatch_extra[{i}]" not in bad and not _SBATCH_OPTION.fullmatch(text):
            p.append(
                f"cluster.sbatch_extra: '{shown(line)}' is not an sbatch long option; "
                "use '--name=value' or '--flag'"
            )
    for option in c.srun_extra:
        if not _SRUN_OPTION.fullmatch(option):
            p.append(
                f"cluster.srun_extra: {option!r} is not an srun long option; use '--name=value' "
                "or '--flag' (no spaces or control characters)"
            )
    return p


def problems(c: ClusterConfig) -> list[str]:
    """Problems with the cluster group, one line each (the sbatch fields on Slurm)."""
    p = []
    if c.kind not in ClusterConfig.KINDS:
        p.append(
            f"cluster.kind={c.kind}: unknown executor; allowed: {', '.join(ClusterConfig.KINDS)}"
        )
    if c.tasks_per_node is not None and c.tasks_per_node < 1:
        p.append(
            f"cluster.tasks_per_node={c.tasks_per_node}: must be >= 1 (or null for one per GPU)"
        )
    p += below_minimum(
        "cluster", c, {"nodes": 1, "gpus_per_node": 0, "array_parallelism": 1, "signal_lead_s": 0}
    )
    if c.kind == "local" and c.nodes != 1:
        p.append(
            f"cluster.nodes={c.nodes}: cluster=local runs on this machine only; use 1, or cluster=slurm"
        )
    if c.kind == "slurm":
        p += slurm_problems(c)
    return p
