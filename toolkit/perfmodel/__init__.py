"""Analytic performance model: FLOPs, memory per rank, communication and roofline step time,
for FSDP2/HSDP composed with tensor and pipeline parallelism.

Library API::

    from toolkit.perfmodel import predict, predict_job, Layout
    p = predict_job(job)            # a JobConfig, world size from its cluster config
    p.step_s, p.dominant, p.memory["peak_bytes"]

    from toolkit.perfmodel import layer_costs, balanced_split
    split = balanced_split(layer_costs(model, seq_len, hw), stages)  # blocks per stage

CLI: ``python -m toolkit.perfmodel [OVERRIDE ...]`` (same Hydra config as the launcher).

Importing the package imports nothing else: each public name is loaded on first use
(PEP 562), so that `python -m toolkit.perfmodel --run RUN` can take the working directory off
sys.path (toolkit/readonly.py) before numpy, omegaconf or hydra are first searched for.
"""

from __future__ import annotations

import importlib  # loaded with the interpreter, as __future__ is; `typing` is not

# public name -> the module that defines it
_EXPORTS = {
    "Layout": "toolkit.perfmodel.model",
    "Prediction": "toolkit.perfmodel.model",
    "balanced_split": "toolkit.perfmodel.pipeline",
    "bubble_fraction": "toolkit.perfmodel.pipeline",
    "layer_costs": "toolkit.perfmodel.pipeline",
    "layout_from_job": "toolkit.perfmodel.job",
    "predict": "toolkit.perfmodel.model",
    "predict_job": "toolkit.perfmodel.job",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
