"""The launcher's `--help` text: every config group with its options and what each is, the
top-level keys and examples; `--help GROUP`: the fields of that group's schema."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from omegaconf import OmegaConf

from toolkit.config.describe import field_docs, option_summary, schema_summary
from toolkit.config.job import GROUPS, JobConfig
from toolkit.config.sources import ConfigDir, group_options, option_file

WIDTH = 100

USAGE = """\
Usage:
  toolkit launch [-m] [-cd DIR ...] [OVERRIDE ...]     (or: python -m toolkit.launch ...)
  toolkit launch --cfg job|hydra|all [--package KEY] [--resolve] [OVERRIDE ...]
  toolkit launch --help [GROUP] | --hydra-help | --info [all|config|defaults|defaults-tree|plugins|searchpath]
  toolkit launch --shell-completion install=bash      (eval "$(toolkit launch --shell-completion install=bash)")
  toolkit launch --compose [OVERRIDE ...]              (inside a batch script: jobs/train.sbatch)

Flags:
  OVERRIDE             group=option (model=gpt_125m), key=value (trainer.steps=50), +key=value adds
  -m, --multirun       comma-separated values sweep: one run per combination (one Slurm array)
  -cd, --config-dir D  search D for config YAML before everything else (repeatable)
  --cfg job|hydra|all  print the composed config and exit; --package KEY prints one subtree
  --resolve            resolve interpolations in --cfg hydra|all output
  --info [WHAT]        Hydra's information: search path, defaults list and tree, composed config
  --hydra-help         Hydra's own help (hydra.* keys)
  --compose            in an sbatch script: prepare the run dir for this allocation, print it
"""

TOP_LEVEL = {
    "hydra.run.dir": "the run directory (default outputs/<date>/<time>)",
    "hydra.sweep.dir": "the parent of a -m sweep's run directories (default multirun/<date>/<time>)",
}

EXAMPLES = """\
Examples:
  toolkit launch model=gpt_tiny trainer.steps=50              # 2 local ranks, 50 steps
  toolkit launch --cfg job model=gpt_1b precision=bf16        # print the resolved job, run nothing
  toolkit launch experiment=quick hydra.run.dir=runs/q1       # a saved delta from experiment/
  toolkit launch -m model=gpt_tiny,gpt_small                  # a sweep, one run dir each
  toolkit launch cluster=slurm cluster.nodes=2 launch.dry_run=true   # the sbatch script, not submitted
  toolkit launch -cd ~/my-conf model=my_tcn cluster=mysite    # options from your own directory
  toolkit launch --help cluster                               # the cluster group's fields
"""


def default_choices(dirs: Sequence[ConfigDir]) -> dict[str, str | None]:
    """group -> the option config.yaml's defaults list selects (the first config.yaml found)."""
    path = next(d.path / "config.yaml" for d in dirs if (d.path / "config.yaml").is_file())
    choices: dict[str, str | None] = {}
    for item in OmegaConf.to_container(OmegaConf.load(path))["defaults"]:
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, list):  # a list of options (tracking: [none]): the first
                    value = value[0] if value else None
                choices[key.removeprefix("optional ").strip()] = value
    return choices


def _wrap(text: str, indent: int) -> str:
    if not text:
        return ""
    lines = textwrap.wrap(text, WIDTH - indent)
    return ("\n" + " " * indent).join(lines)


def _option_lines(group: str, dirs: Sequence[ConfigDir], default: str | None) -> list[str]:
    options = group_options(group, dirs)
    width = max((len(o) for o in options), default=0) + 3
    fallback = schema_summary(GROUPS[group]) if group in GROUPS else ""
    lines = []
    for option, source in options.items():
        mark = "*" if option == default else " "
        text = option_summary(source.path / group / f"{option}.yaml") or fallback
        if source.origin != "package":
            text = f"[{source.origin}] {text}"
        lines.append(f"    {option + mark:<{width}}{_wrap(text, 4 + width)}".rstrip())
    return lines


def launch_help(dirs: Sequence[ConfigDir]) -> str:
    """The whole `--help` text."""
    defaults = default_choices(dirs)
    out = [
        "toolkit launch: compose a training job from config groups, validate it, and run it on",
        "this machine or on Slurm. Bad input exits 2 before any rank starts, one line per problem.",
        "",
        USAGE,
        "Config groups (group=option; * marks the default; `--help GROUP` lists its fields):",
    ]
    for group in [*GROUPS, "experiment"]:
        what = (
            schema_summary(GROUPS[group]) if group in GROUPS else "saved deltas (@package _global_)"
        )
        default = defaults.get(group)
        out.append(f"  {group}: {what}" + ("" if group in GROUPS else "; none by default"))
        out += _option_lines(group, dirs, default)
    out += ["", "Top-level keys:"]
    for doc in field_docs(JobConfig):
        if doc.name not in GROUPS:
            out.append(f"  {doc.name}: {doc.type} = {doc.default}  {doc.help}".rstrip())
    out += [f"  {key}: {text}" for key, text in TOP_LEVEL.items()]
    out += ["", "Config directories (searched first to last; the first file found wins):"]
    out += [f"  {d.path}  ({d.origin})" for d in dirs]
    out += ["", EXAMPLES.rstrip()]
    return "\n".join(out) + "\n"


def group_help(group: str, dirs: Sequence[ConfigDir]) -> str:
    """`--help GROUP`: the group's options, and its schema's fields with types, defaults and
    help text."""
    default = default_choices(dirs).get(group)
    if group == "experiment":
        return (
            "\n".join(
                [
                    "experiment: saved deltas (@package _global_)",
                    *_option_lines(group, dirs, default),
                ]
            )
            + "\n"
        )
    schema = GROUPS[group]
    out = [
        f"{group}: {schema_summary(schema)} ({schema.__module__}.{schema.__name__})",
        "",
        "Options:",
    ]
    out += _option_lines(group, dirs, default)
    docs = field_docs(schema)
    width = max(len(d.name) for d in docs) + 2
    out += ["", f"Fields ({group}.FIELD=VALUE on the command line; type = default):"]
    for doc in docs:
        out.append(f"  {doc.name:<{width}}{doc.type} = {doc.default}")
        if doc.help:
            out.append(" " * (width + 4) + _wrap(doc.help, width + 4))
    if default is not None and option_file(group, default, dirs) is not None:
        out += ["", f"The default option ({default}) may set other values: --cfg job shows them."]
    return "\n".join(out) + "\n"


def help_topics() -> list[str]:
    return [*GROUPS, "experiment"]
