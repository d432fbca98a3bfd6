"""Compose the job config with Hydra and turn Hydra/OmegaConf failures into one-line errors."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
import typing
from collections.abc import Sequence
from typing import Any

from hydra import compose
from hydra.core.utils import setup_globals
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from toolkit.config import sources
from toolkit.config.errors import ConfigError, control_problem
from toolkit.config.job import (
    GROUP_KINDS,
    GROUPS,
    OPEN_GROUPS,
    OTHER_KINDS,
    TARGET_SCHEMAS,
    JobConfig,
)
from toolkit.config.model import PluginModelConfig
from toolkit.config.store import register_configs
from toolkit.config.targets import TargetConfig, as_node, from_node, is_target_node


def group_options(group: str, config_dirs: Sequence[str | os.PathLike] = ()) -> list[str]:
    """The selectable options of a config group in every searched directory (toolkit.config.
    sources), YAML files only, schemas excluded."""
    return list(sources.group_options(group, sources.search_dirs(config_dirs)))


def dict_field_prefixes() -> tuple[str, ...]:
    """`group.field.` for every dict-typed schema field (e.g. `nccl.env.`): new keys may be
    added there without Hydra's `+`."""
    prefixes = []
    schemas = [(g, s) for g, s in GROUPS.items()]
    schemas += [(g, s) for g, kinds in GROUP_KINDS.items() for s in kinds.values()]
    for group, schema in schemas:
        for name, hint in typing.get_type_hints(schema).items():
            if typing.get_origin(hint) is dict and f"{group}.{name}." not in prefixes:
                prefixes.append(f"{group}.{name}.")
    return tuple(prefixes)


def open_dict_overrides(overrides: list[str]) -> list[str]:
    """`nccl.env.NCCL_BUFFSIZE=4M` -> `++nccl.env.NCCL_BUFFSIZE=4M` (add or override), and
    `nccl.env={A: b}` likewise (merged into the dict)."""
    prefixes = dict_field_prefixes()
    fields = tuple(p[:-1] + "=" for p in prefixes)
    return [f"++{item}" if item.startswith(prefixes + fields) else item for item in overrides]


def compose_raw(overrides: list[str], config_dirs: Sequence[str | os.PathLike] = ()) -> DictConfig:
    """Hydra composition with the hydra node kept (run/sweep dirs, runtime choices), from the
    directories of toolkit.config.sources (`config_dirs`: the command line's --config-dir)."""
    refused = override_problems(overrides)
    if refused:
        raise ConfigError(refused)
    overrides = open_dict_overrides(overrides)
    register_configs()
    setup_globals()
    try:
        dirs = sources.search_dirs(config_dirs)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    try:
        with sources.hydra_search_path(dirs):
            overrides = target_overrides(overrides)
            return compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(explain(exc, overrides, config_dirs)) from None


# The option of each group whose node is `_target_: ???` (conf/<group>/<option>.yaml).
TARGET_OPTIONS = {"model": "target", "optim": "target", "data": "dataset"}
PLUGIN_OPTION = "plugin"  # conf/<group>/plugin.yaml: `kind: ???` (a registered kind)


def target_overrides(overrides: list[str]) -> list[str]:
    """Your own object from the command line alone: `model._target_=mypkg.LSTM` selects the
    group's `target` option, and `model.kind=NAME` of no built-in kind its `plugin` option,
    when no option of the group is chosen; the keys of such an open node (its keyword
    arguments or a registered model's options) are set or added without Hydra's `+`."""
    out = list(overrides)
    keys = [item.lstrip("+~").partition("=")[0] for item in out]
    values = [item.partition("=")[2] for item in out]
    for group in set(TARGET_SCHEMAS) | set(GROUP_KINDS):
        if group in keys:
            continue
        kind = next((v for k, v in zip(keys, values, strict=True) if k == f"{group}.kind"), None)
        if f"{group}._target_" in keys and group in TARGET_SCHEMAS:
            out.insert(0, f"{group}={TARGET_OPTIONS[group]}")
        elif kind is not None and kind not in GROUP_KINDS.get(group, {kind: None}):
            out.insert(0, f"{group}={PLUGIN_OPTION}")
        elif (
            kind is not None
            and GROUP_KINDS.get(group, {}).get(kind, GROUPS[group]) is not (GROUPS[group])
        ):
            # A built-in kind with a schema of its own (model.kind=hf_causal_lm): its
            # schema's defaults, not the default option's fields (a GPT's num_layers, ...).
            out.insert(0, f"{group}={kind}_schema")
        else:
            continue
        keys.insert(0, group)
        values.insert(0, "")
    dotted = {key.split(".")[0] for key in keys if "." in key} & set(OPEN_GROUPS)
    if not dotted:
        return out
    # Which of those groups hold an open node: compose their selections alone.
    pairs = list(zip(out, keys, strict=True))
    selections = [item for item, key in pairs if "." not in key]
    selections += [item for item, key in pairs if key.endswith(("._target_", ".kind"))]
    base = compose(config_name="config", overrides=selections)
    opened = {g for g in dotted if is_open_node(g, OmegaConf.to_container(base[g]))}
    return [
        f"++{item.lstrip('+')}"
        if "." in key and key.split(".")[0] in opened and item[0] != "~"
        else item
        for item, key in pairs
    ]


def is_open_node(group: str, node: Any) -> bool:
    """A node no schema closes: your own object's (`_target_`) or a registered kind's."""
    if is_target_node(node):
        return True
    kinds = GROUP_KINDS.get(group)
    return bool(kinds) and isinstance(node, dict) and str(node.get("kind")) not in kinds


def override_problems(overrides: list[str]) -> list[str]:
    """An override with a control character (a newline, CR, NUL, tab) is refused before Hydra
    parses it: such values end up in generated scripts, and Hydra's own error would show the
    raw characters across several lines."""
    problems = []
    for item in overrides:
        name, _, value = item.lstrip("+~").partition("=")
        problems += control_problem(name, value) or control_problem("override", name)
    return problems


def job_or_none(
    overrides: list[str], config_dirs: Sequence[str | os.PathLike] = ()
) -> JobConfig | None:
    """The typed job for these overrides (`config_dirs`: the command line's --config-dir),
    or None after printing each problem as one `error:` line on stderr (for CLIs that
    compose a job without launching it)."""
    try:
        return to_job(compose_raw(overrides, config_dirs))
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return None


def to_job(cfg: DictConfig) -> JobConfig:
    """The typed job config (hydra node dropped, interpolations resolved)."""
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.pop("hydra", None)
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)  # the composed root is a mapping
    open_nodes = {group: plain.pop(group) for group in OPEN_GROUPS if group in plain}
    try:
        job = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(JobConfig), plain))
        assert isinstance(job, JobConfig)
        for group, node in open_nodes.items():
            setattr(job, group, group_config(group, node))
    except OmegaConfBaseException as exc:
        raise ConfigError(explain(exc, [])) from None
    return job


def group_config(group: str, node: Any) -> Any:
    """An open group's typed config: its `_target_` schema for a node that names your own
    object (toolkit.config.targets); else the schema of the node's kind (GROUP_KINDS), a
    kind of no built-in schema typed by OTHER_KINDS (a registered plugin's); else the
    group's schema. Errors carry the group in their key."""
    node = node or {}
    if is_target_node(node) and group in TARGET_SCHEMAS:
        try:
            return from_node(TARGET_SCHEMAS[group], node)
        except OmegaConfBaseException as exc:
            exc.full_key = f"{group}.{getattr(exc, 'full_key', '') or ''}".rstrip(".")
            raise
    kinds = GROUP_KINDS.get(group)
    kind = str(node.get("kind", "")) if isinstance(node, dict) else ""
    if kinds and kind and kind not in kinds and group in OTHER_KINDS:
        return OTHER_KINDS[group](node)
    schema = kinds.get(kind, GROUPS[group]) if kinds else GROUPS[group]
    try:
        merged = OmegaConf.merge(
            OmegaConf.create({group: OmegaConf.structured(schema)}), {group: node}
        )
    except (ConfigKeyError, ConfigAttributeError) as exc:
        # The valid keys are this kind's schema's, not the group's default one's.
        key = str(getattr(exc, "full_key", "") or "")
        fields = ", ".join(f.name for f in dataclasses.fields(schema))
        raise ConfigError(
            f"{key}: unknown key '{key.rsplit('.', 1)[-1]}' in {group} of kind {kind}; "
            f"valid keys: {fields}"
        ) from None
    return OmegaConf.to_object(merged[group])


def job_to_dict(job: JobConfig) -> dict[str, Any]:
    """The job as plain data (config.yaml): a `_target_` group as its flat node again."""
    out = dataclasses.asdict(job)
    for group in OPEN_GROUPS:
        value = getattr(job, group)
        if isinstance(value, TargetConfig):
            out[group] = as_node(value)
        elif isinstance(value, PluginModelConfig):  # a registered model's node, flat
            out[group] = {"kind": value.kind, "name": value.name, **value.options}
    return out


def load_job(path: str | os.PathLike) -> JobConfig:
    """Read a resolved config.yaml written by the launcher back into a JobConfig."""
    return to_job(OmegaConf.load(path))


def _schema_fields(key: str) -> list[str] | None:
    group = key.split(".")[0]
    schema = GROUPS.get(group)
    if schema is None:
        return [f.name for f in dataclasses.fields(JobConfig)]
    return [f.name for f in dataclasses.fields(schema)]


def explain(
    exc: BaseException, overrides: list[str], config_dirs: Sequence[str | os.PathLike] = ()
) -> str:
    """One line: the field, the bad value, what is allowed."""
    if exc.__cause__ is not None and isinstance(exc.__cause__, OmegaConfBaseException):
        exc = exc.__cause__
    msg = str(exc)
    if isinstance(exc, MissingConfigException) or "Could not find" in msg:
        m = re.search(r"Could not (?:find|load) '([\w/]+)'", msg) or re.search(
            r"'([\w]+)/(\w+)'", msg
        )
        target = m.group(1) if m else ""
        group, _, option = target.rpartition("/")
        if group in GROUPS or group == "experiment":
            allowed = ", ".join(group_options(group, config_dirs))
            return f"{group}={option}: no such option in group '{group}'; allowed: {allowed}"
        return f"config error: {msg.splitlines()[0]}"
    full_key = _full_key(exc, msg)
    value = _override_value(full_key, overrides)
    if re.search(r"Key '[^']+' not in", msg) or type(exc).__name__ in (
        "ConfigKeyError",
        "ConfigAttributeError",
    ):
        fields = _schema_fields(full_key or "")
        leaf = (full_key or "").rsplit(".", 1)[-1]
        section = (full_key or "").rsplit(".", 1)[0] if "." in (full_key or "") else "the job"
        return (
            f"{full_key}: unknown key '{leaf}' in {section}; valid keys: {', '.join(fields or [])}"
        )
    if (
        "could not be converted" in msg
        or "Value '" in msg
        or "ValidationError" in type(exc).__name__
    ):
        expected = _expected_type(msg)
        return f"{full_key}={value}: wrong type; expected {expected}"
    first = next((line for line in msg.splitlines() if line.strip()), msg)
    return f"config error: {first}"


def _full_key(exc: BaseException, msg: str) -> str | None:
    key = getattr(exc, "full_key", None)
    if key:
        return str(key)
    m = re.search(r"full_key:\s*(\S+)", msg)
    if m:
        return m.group(1)
    m = re.search(r"Could not override '([^']+)'", msg)
    if m:
        return m.group(1)
    m = re.search(r"Key '([^']+)'", msg)
    return m.group(1) if m else None


def _override_value(key: str | None, overrides: list[str]) -> str:
    for item in overrides:
        name, sep, value = item.lstrip("+~").partition("=")
        if sep and name == key:
            return value
    return "?"


def _expected_type(msg: str) -> str:
    m = re.search(r"could not be converted to (\w+)", msg)
    if m:
        return m.group(1).lower()
    m = re.search(r"to type\s+'?(\w+)", msg)
    return m.group(1).lower() if m else "a value of the schema's type"
