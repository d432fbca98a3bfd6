"""Analytic performance model: FLOPs, memory per rank, communication and roofline step time,
for FSDP2/HSDP composed with tensor and pipeline parallelism.

Library API::

    from toolkit.perfmodel import predict, predict_job, Layout
    p = predict_job(job)            # a JobConfig, world size from its cluster config
    p.step_s, p.dominant, p.memory["peak_bytes"]

    from toolkit.perfmodel import layer_costs, balanced_split
    split = balanced_split(layer_costs(model, seq_len, hw), stages)  # blocks per stage

CLI: ``python -m toolkit.perfmodel [OVERRIDE ...]`` (same Hydra config as the launcher).
"""

from toolkit.perfmodel.job import layout_from_job, predict_job
from toolkit.perfmodel.model import Layout, Prediction, predict
from toolkit.perfmodel.pipeline import balanced_split, bubble_fraction, layer_costs

__all__ = [
    "Layout",
    "Prediction",
    "balanced_split",
    "bubble_fraction",
    "layer_costs",
    "layout_from_job",
    "predict",
    "predict_job",
]
