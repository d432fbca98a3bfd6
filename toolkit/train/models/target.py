"""Your own nn.Module by import path (`model._target_`, toolkit.config.model.TargetModelConfig):
built with Hydra's instantiate, its loss by the convention its config names.

Loss conventions (model.loss):
- auto: the model's own. With an (inputs, targets) pair: `model.loss(model(inputs), targets)`
  when the model has a `loss` method, else `model(inputs, targets)` must return the loss;
  with a dict batch, `model(**batch)` (an object with `.loss`, as Hugging Face models return,
  or the loss itself); with one tensor, `model(batch)`.
- mse | huber | cross_entropy: that loss of (model(inputs), targets) over a pair.
- an import path: a function (output, targets) -> loss, over a pair.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.config.model import TargetModelConfig
from toolkit.errors import UserError
from toolkit.train.models.spec import Batch, ModelSpec, modules_of_classes, repeated_children
from toolkit.train.targets import locate

LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mse": lambda out, y: F.mse_loss(out.float(), y.float()),
    "huber": lambda out, y: F.huber_loss(out.float(), y.float()),
    "cross_entropy": lambda out, y: F.cross_entropy(out.float().flatten(0, -2), y.flatten()),
}


def import_path(path: str, what: str) -> object:
    """The object at `module.attribute` (attributes may nest), or a one-line UserError."""
    found, why = locate(path)
    if why is not None:
        raise UserError(
            f"{what}={path}: cannot import it ({why}); is its package installed, or on "
            "PYTHONPATH for the launcher and every rank?"
        )
    return found


def build(cfg: TargetModelConfig) -> nn.Module:
    from hydra.utils import instantiate

    import_path(cfg.target, "model._target_")  # a missing module: one line, not Hydra's
    model = instantiate({"_target_": cfg.target, **cfg.kwargs}, _convert_="all")
    if not isinstance(model, nn.Module):
        raise UserError(
            f"model._target_={cfg.target}: built a {type(model).__name__}, not an nn.Module"
        )
    return model


def loss_fn(cfg: TargetModelConfig) -> Callable[[nn.Module, Batch], torch.Tensor]:
    if cfg.loss == "auto":
        return own_loss
    fn = LOSSES.get(cfg.loss) or import_path(cfg.loss, "model.loss")
    if not callable(fn):
        raise UserError(f"model.loss={cfg.loss}: not a function (output, targets) -> loss")

    def named(model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, targets = pair(batch, cfg.loss)
        return scalar(fn(model(inputs), targets), f"model.loss={cfg.loss}")

    return named


def own_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    if isinstance(batch, dict):
        out = model(**batch)
        return scalar(getattr(out, "loss", out), "model(**batch)")
    if isinstance(batch, torch.Tensor):
        return scalar(model(batch), "model(batch)")
    inputs, targets = pair(batch, "auto")
    own = getattr(model, "loss", None)
    if callable(own) and not isinstance(own, nn.Module):
        return scalar(own(model(inputs), targets), "model.loss(model(inputs), targets)")
    try:
        return scalar(model(inputs, targets), "model(inputs, targets)")
    except TypeError as exc:
        if "positional argument" not in str(exc):
            raise
        raise UserError(
            f"model(inputs, targets): {exc}; a model whose forward takes the inputs alone "
            "needs a loss: give it a loss(output, targets) method, or set "
            "model.loss=mse|huber|cross_entropy|module.fn"
        ) from None


def pair(batch: Batch, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, list | tuple) and len(batch) == 2:
        return batch[0], batch[1]
    raise UserError(
        f"model.loss={loss}: needs (inputs, targets) micro-batches, got {type(batch).__name__}; "
        "return pairs from the dataset / collate, or compute the loss in the model"
    )


def scalar(loss: object, call: str) -> torch.Tensor:
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
    raise UserError(
        f"{call} returned {shape}, not a scalar loss: return the loss, give the model a "
        "loss(output, targets) method, or set model.loss=mse|huber|cross_entropy|module.fn"
    )


def units_fn(cfg: TargetModelConfig) -> Callable[[nn.Module], list[nn.Module]]:
    if not cfg.units:
        return repeated_children
    classes = tuple(import_path(path, "model.units") for path in cfg.units)
    for path, cls in zip(cfg.units, classes, strict=True):
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise UserError(f"model.units: {path} is not an nn.Module class")

    def units(model: nn.Module) -> list[nn.Module]:
        found = modules_of_classes(model, classes)
        if not found:
            raise UserError(f"model.units={list(cfg.units)}: the model holds no such module")
        return found

    return units


def predict_fn(cfg: TargetModelConfig) -> Callable[[nn.Module, Batch], tuple]:
    """The model's predictions for an eval metric (data=returns: val_ic), as for the built-in
    time-series model: model(inputs) against the targets of an (inputs, targets) pair, where
    the forward gives predictions (a named loss, or the model's own loss(output, targets));
    (None, None), no metric, where it does not say."""

    def predict(model: nn.Module, batch: Batch) -> tuple:
        own = callable(getattr(model, "loss", None)) or cfg.loss != "auto"
        if not own or not (isinstance(batch, list | tuple) and len(batch) == 2):
            return None, None
        inputs, targets = batch
        out = model(inputs)  # several heads (a tuple) score nothing: no one prediction
        if not isinstance(out, torch.Tensor) or not isinstance(targets, torch.Tensor):
            return None, None
        last = out[:, -1] if out.dim() == 3 and targets.dim() == 2 else out  # a sequence's
        return (last, targets) if last.shape == targets.shape else (None, None)

    return predict


def spec(cfg: TargetModelConfig) -> ModelSpec:
    return ModelSpec(
        name=cfg.name or cfg.target.rsplit(".", 1)[-1],
        build=build,
        units=units_fn(cfg),
        loss=loss_fn(cfg),
        predict=predict_fn(cfg),
    )
