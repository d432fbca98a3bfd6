"""Your own objects in a config group, by import path: Hydra's `_target_` convention.

A group node that holds `_target_` names a callable (a model class, a Dataset, an optimizer)
to build with the node's other keys as keyword arguments, e.g.

    model:
      _target_: mypkg.models.LSTMForecaster
      hidden: 128
      num_layers: 2

The toolkit's own settings for such a node (the fields of the group's target schema, e.g.
the model's `name`) are taken out first; every other key is a keyword argument. The typed
form keeps them apart (`target`, `kwargs`, the settings), and `as_node` writes the node back
in the same flat form, so a run's config.yaml composes again as it was written.

This module only describes and validates: the import happens in the rank
(toolkit.train.models), never at composition.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import OmegaConf

TARGET = "_target_"
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


@dataclass
class TargetConfig:
    """The part every target schema shares: what to build and with which arguments."""

    target: str = ""  # an import path, module.attribute (the node's `_target_`)
    kwargs: dict[str, Any] = field(default_factory=dict)


T = TypeVar("T", bound=TargetConfig)


def is_target_node(node: object) -> bool:
    return isinstance(node, dict) and TARGET in node


def settings_of(schema: type[TargetConfig]) -> list[str]:
    """The toolkit's own keys of a target node (the schema's fields but target/kwargs)."""
    shared = {f.name for f in dataclasses.fields(TargetConfig)}
    return [f.name for f in dataclasses.fields(schema) if f.name not in shared]


def from_node(schema: type[T], node: dict[str, Any]) -> T:
    """The typed config of a `_target_` node: settings by name, the rest keyword arguments.
    A setting of the wrong type raises OmegaConf's error with its key (the caller explains
    it in one line)."""
    settings = set(settings_of(schema))
    plain = {key: value for key, value in node.items() if key in settings}
    kwargs = {key: value for key, value in node.items() if key not in settings and key != TARGET}
    merged = OmegaConf.merge(
        OmegaConf.structured(schema), {**plain, "target": str(node[TARGET]), "kwargs": kwargs}
    )
    obj = OmegaConf.to_object(merged)
    if not isinstance(obj, schema):  # OmegaConf builds exactly the schema's type
        raise TypeError(f"expected {schema.__name__}, got {type(obj).__name__}")
    return obj


def as_node(cfg: TargetConfig) -> dict[str, Any]:
    """The flat node again: `_target_`, the settings, the keyword arguments."""
    settings = {name: getattr(cfg, name) for name in settings_of(type(cfg))}
    return {TARGET: cfg.target, **dataclasses.asdict(cfg)["kwargs"], **_plain(settings)}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in values.items()
    }


def target_problems(group: str, cfg: TargetConfig) -> list[str]:
    """The import path is a dotted name (it reaches a rank's import, nothing else)."""
    if cfg.target in ("", "???"):
        return [
            f"{group}._target_: missing; name what to build by import path, e.g. "
            f"{group}._target_=mypkg.module.Class"
        ]
    if not IMPORT_PATH.fullmatch(cfg.target):
        return [
            f"{group}._target_={cfg.target!r}: not an import path; use module.attribute, "
            "e.g. mypkg.models.LSTMForecaster"
        ]
    return []
