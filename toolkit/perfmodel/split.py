"""The model's terms regrouped as a training step measures itself, so that predicted and
measured can stand side by side (pure: dicts in, dicts out).

A step record (toolkit.events.StepRecord) splits its wall time into data wait, compute,
exposed communication, the optimizer step and the checkpoint stall. The model's terms map onto
those parts:

    compute                = gemm + attention + elementwise + overhead (op dispatch, FSDP2's
                             per-unit bookkeeping) + fsdp_copy (FSDP2's copy-in/copy-out)
    exposed_communication  = exposed FSDP2 traffic + tensor-parallel collectives + pipeline
                             sends + the pipeline bubble (a stage waits in its receive) + the
                             small all-reduces (loss, grad norm)
    optimizer              = the optimizer's own kernels (AdamW and clipping arithmetic)
    data_wait              = 0 (the model assumes the loader keeps up)
    checkpoint_stall       = the async save's staging copy, per step (toolkit.perfmodel.job)
"""

from __future__ import annotations

from collections.abc import Mapping

# Measured StepRecord field (median per step) of each part.
MEASURED_FIELD = {
    "compute": "compute_s",
    "exposed_communication": "comm_exposed_s",
    "optimizer": "optimizer_step_s",
    "data_wait": "data_wait_s",
    "checkpoint_stall": "checkpoint_stall_s",
    "step": "step_time_s",
}
PARTS = tuple(MEASURED_FIELD)


def predicted_split(time: Mapping[str, object]) -> dict[str, float]:
    """Seconds per step of each part, from a Prediction's `time`."""

    def t(key: str) -> float:
        return float(time.get(key, 0.0))  # type: ignore[arg-type]

    small = t("small_allreduce_s")
    return {
        "compute": t("compute_s"),
        "exposed_communication": t("communication_s")
        + t("tp_communication_s")
        + t("pipeline_p2p_s")
        + t("pipeline_bubble_s")
        + small,
        "optimizer": t("optimizer_s") - small,
        "data_wait": t("data_wait_s"),
        "checkpoint_stall": t("checkpoint_stall_s"),
        "step": t("step_s"),
    }
