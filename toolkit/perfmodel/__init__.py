"""Analytic performance model: FLOPs, memory per rank, communication and roofline step time.

Library API::

    from toolkit.perfmodel import predict, predict_job, Layout
    p = predict_job(job)            # a JobConfig, world size from its cluster config
    p.step_s, p.dominant, p.memory["peak_bytes"]

CLI: ``python -m toolkit.perfmodel [OVERRIDE ...]`` (same Hydra config as the launcher).
"""

from toolkit.perfmodel.job import layout_from_job, predict_job
from toolkit.perfmodel.model import Layout, Prediction, predict

__all__ = ["Layout", "Prediction", "layout_from_job", "predict", "predict_job"]
