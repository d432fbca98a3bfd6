"""The launcher's check of the model group: the spec of a model of yours can be found and
built as configured, and supports the layout asked for (one line each, before any rank
starts). Imports torch and your package only for such a model: the built-in kinds need
nothing beyond their own config checks."""

from __future__ import annotations

from typing import Any

from toolkit.config.model import TransformerConfig
from toolkit.config.parallel import mesh_shape


def model_problems(job: Any, world: int) -> list[str]:
    if isinstance(job.model, TransformerConfig):
        return []
    from toolkit.train.models.registry import problems

    shape = mesh_shape(job.parallel, world)
    tp, pp = (1, 1) if isinstance(shape, str) else (shape.tp, shape.pp)
    return problems(job.model, tp, pp)
