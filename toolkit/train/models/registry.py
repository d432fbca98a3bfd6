"""Which ModelSpec a model config names: the built-in kinds, your `_target_` model, or a model
your package registers under the `toolkit.models` entry points.

Registering a model from your own package (every rank finds it, locally or on Slurm, as
long as the package is installed in the job's Python):

    # pyproject.toml of your package
    [project.entry-points."toolkit.models"]
    lstm_forecaster = "mypkg.toolkit_spec:SPEC"

SPEC is a toolkit.train.models.spec.ModelSpec (or a function returning one) whose `config`
is a dataclass of its options; `model.kind=lstm_forecaster model.hidden=128` then builds it,
and its options are checked against that dataclass by the launcher.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib.metadata import entry_points
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from toolkit.config.model import KINDS as MODEL_KINDS
from toolkit.config.model import (
    GPTConfig,
    HFModelConfig,
    ModelConfig,
    PluginModelConfig,
    TargetModelConfig,
    TimeSeriesConfig,
)
from toolkit.errors import UserError
from toolkit.train.models import builtin, hf, target
from toolkit.train.models.spec import ModelSpec

ENTRY_POINT_GROUP = "toolkit.models"


@functools.cache
def registered() -> dict[str, ModelSpec]:
    """name -> spec of every model registered under the `toolkit.models` entry points."""
    specs = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
        except Exception as exc:  # noqa: BLE001 - a user's entry point: one line, what failed
            raise UserError(
                f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}) does not load: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        spec = loaded() if callable(loaded) and not isinstance(loaded, ModelSpec) else loaded
        if not isinstance(spec, ModelSpec):
            raise UserError(
                f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}): gives a "
                f"{type(spec).__name__}, not a toolkit.train.models.spec.ModelSpec"
            )
        specs[ep.name] = spec
    return specs


def spec_for(cfg: ModelConfig) -> ModelSpec:
    """The spec that builds and trains this model."""
    if isinstance(cfg, GPTConfig):
        return builtin.GPT_SPEC
    if isinstance(cfg, TimeSeriesConfig):
        return builtin.TIMESERIES_SPEC
    if isinstance(cfg, HFModelConfig):
        return hf.SPEC
    if isinstance(cfg, TargetModelConfig):
        return target.spec(cfg)
    if isinstance(cfg, PluginModelConfig):
        specs = registered()
        if cfg.kind not in specs:
            known = ", ".join([*MODEL_KINDS, *sorted(specs)])
            raise UserError(
                f"model.kind={cfg.kind}: unknown; known kinds: {known} (a model of your own: "
                f"model._target_=module.Class, or an entry point in group {ENTRY_POINT_GROUP})"
            )
        return specs[cfg.kind]
    raise TypeError(f"not a model config: {type(cfg).__name__}")


def spec_config(cfg: ModelConfig) -> Any:
    """What the spec's build receives: the config itself, or a plugin's options typed by
    its own config class (a one-line error for a wrong key or type)."""
    if not isinstance(cfg, PluginModelConfig):
        return cfg
    spec = spec_for(cfg)
    if spec.config is None:
        return dict(cfg.options)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(spec.config), cfg.options)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or "?"
        fields = ", ".join(f.name for f in dataclasses.fields(spec.config))
        raise UserError(
            f"model.{key}: not an option of model.kind={cfg.kind} ({exc.__class__.__name__}); "
            f"its options: {fields}"
        ) from None


def build(cfg: ModelConfig):
    """The model, on the CPU with the default init (seed first for identical ranks)."""
    return spec_for(cfg).build(spec_config(cfg))


def problems(cfg: ModelConfig, tp: int, pp: int) -> list[str]:
    """The launcher's runtime check: the model's spec can be found, its options fit its
    config, and it supports the layout (one line each)."""
    try:
        spec = spec_for(cfg)
        spec_config(cfg)
        if isinstance(cfg, TargetModelConfig):
            target.import_path(cfg.target, "model._target_")
            target.units_fn(cfg)
    except UserError as exc:
        return [str(exc)]
    p = []
    if isinstance(cfg, PluginModelConfig) and tp > 1 and spec.tensor_parallel is None:
        p.append(
            f"parallel.tp={tp}: model {cfg.kind} has no tensor-parallel plan; give its "
            "ModelSpec a tensor_parallel function (docs/extending.md) or use parallel.tp=1"
        )
    if isinstance(cfg, HFModelConfig) and tp > 1:  # transformers' published plan
        p += hf.tp_problems(cfg, tp)
    if isinstance(cfg, PluginModelConfig) and pp > 1 and not spec.pipeline:
        p.append(f"parallel.pp={pp}: model {cfg.kind} has no pipeline split; use parallel.pp=1")
    return p
