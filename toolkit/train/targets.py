"""Your own optimizer and callbacks, named by import path (`_target_`): the launcher's checks
that each imports and is the right kind of thing (one line each, before any rank starts),
and the rank's construction of the callbacks.

The launcher imports `module.attribute` as Hydra's instantiate will in the rank (without
Hydra's own error printing), so what it accepts is what the rank builds. Imports no torch unless the job names an
optimizer by import path (the launcher stays light)."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from hydra.utils import instantiate

from toolkit.config.optim import OptimTargetConfig
from toolkit.config.targets import TARGET
from toolkit.hooks import Hook


def locate(path: str) -> tuple[Any, str | None]:
    """The object at `path` (module.attribute, attributes may nest: module.Class.method),
    or None and why not (the import error in a few words)."""
    module, attributes = path, []
    while True:
        module, _, attribute = module.rpartition(".")
        attributes.insert(0, attribute)
        if not module:
            return None, f"ModuleNotFoundError: no module in {path!r}"
        try:
            found: Any = importlib.import_module(module)
            break
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module.startswith(exc.name):
                return None, f"ModuleNotFoundError: {exc}"  # it imports something missing
            if "." not in module:
                return None, f"ModuleNotFoundError: {exc}"
        except Exception as exc:  # noqa: BLE001 - any failure of a user's import is one line
            text = str(exc).splitlines()[0] if str(exc) else ""
            return None, f"{type(exc).__name__}: {text}"
    for attribute in attributes:
        if not hasattr(found, attribute):
            return None, f"AttributeError: {getattr(found, '__name__', found)} has no {attribute!r}"
        found = getattr(found, attribute)
    return found, None


def optimizer_problems(job: Any, world: int) -> list[str]:
    """`optim._target_` imports and is a torch.optim.Optimizer subclass."""
    if not isinstance(job.optim, OptimTargetConfig):
        return []
    import torch

    found, why = locate(job.optim.target)
    if why is not None:
        return [
            f"optim._target_={job.optim.target}: cannot import it ({why}); is its package installed, or on PYTHONPATH for the launcher and every rank?"
        ]
    if not (inspect.isclass(found) and issubclass(found, torch.optim.Optimizer)):
        return [
            f"optim._target_={job.optim.target}: not a torch.optim.Optimizer subclass "
            "(e.g. torch.optim.SGD, torch.optim.RAdam)"
        ]
    return []


def dataset_import_problems(job: Any, world: int) -> list[str]:
    """`data._target_`, `data.val._target_` and `data.collate_fn` import (the Dataset itself
    is built in the rank: its constructor may read files the launcher cannot see)."""
    from toolkit.config.data import DatasetConfig

    if not isinstance(job.data, DatasetConfig):
        return []
    paths = {"data._target_": job.data.target, "data.collate_fn": job.data.collate_fn}
    if job.data.val is not None:
        paths["data.val._target_"] = str(job.data.val[TARGET])
    p = []
    for name, path in paths.items():
        if path is None:
            continue
        found, why = locate(path)
        if why is not None:
            p.append(
                f"{name}={path}: cannot import it ({why}); is its package installed, or on PYTHONPATH for the launcher and every rank?"
            )
        elif not callable(found):
            p.append(f"{name}={path}: not a class or function")
    return p


def callback_problems(job: Any, world: int) -> list[str]:
    """Each `trainer.callbacks` entry imports and is a toolkit.hooks.Hook subclass (or a
    function, which must return one: checked in the rank)."""
    p = []
    for i, node in enumerate(job.trainer.callbacks):
        target = node[TARGET]  # trainer.problems checked that there is one
        found, why = locate(target)
        name = f"trainer.callbacks[{i}]._target_={target}"
        if why is not None:
            p.append(
                f"{name}: cannot import it ({why}); is its package installed, or on PYTHONPATH for the launcher and every rank?"
            )
        elif inspect.isclass(found) and not issubclass(found, Hook):
            p.append(
                f"{name}: not a toolkit.hooks.Hook subclass; subclass it and override the methods you need"
            )
        elif not callable(found):
            p.append(f"{name}: not a class or function")
    return p


def build_callbacks(nodes: list[dict[str, Any]]) -> list[Hook]:
    """The user's hooks of trainer.callbacks, in order, built with their keyword arguments."""
    hooks = []
    for i, node in enumerate(nodes):
        hook = instantiate({"_convert_": "all", **node})
        if not isinstance(hook, Hook):
            raise TypeError(
                f"trainer.callbacks[{i}]._target_={node[TARGET]}: built a "
                f"{type(hook).__name__}, not a toolkit.hooks.Hook"
            )
        hooks.append(hook)
    return hooks
