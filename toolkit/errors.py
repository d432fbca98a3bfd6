"""Exit statuses with a meaning, and the error for conditions the user can act on.

A `UserError` (a corrupt checkpoint with checkpoint.on_corrupt=fail, a config change refused
on resume, a resume that cannot reshard) ends the job with one line from rank 0 saying what
happened and what to do, and its own exit status; no traceback. Every other exception is a
bug and keeps its traceback (toolkit.entrypoint).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CONFIG = 2  # the launcher refused the config before any rank started
EXIT_CHECKPOINT_UNUSABLE = 65  # EX_DATAERR: no checkpoint can be resumed, or a dataset is bad
EXIT_RUN_DIR_BUSY = 73  # EX_CANTCREAT: another launch or job writes into this run dir
EXIT_SAVE_FAILED = 74  # EX_IOERR: stopped because a checkpoint could not be written
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpointed after a signal; relaunch to resume
EXIT_RESUME_REFUSED = 78  # EX_CONFIG: the run's config does not fit the checkpoint's
EXIT_HANG = 79  # a rank made no progress for fault.hang_timeout_s; stacks dumped, then ended
EXIT_NONFINITE = 80  # the loss or grad norm went NaN/inf (trainer.on_nonfinite=stop): nothing
# was applied or committed from that step; lower the learning rate, or resume and skip it
EXIT_TELEMETRY_LOST = 81  # a node agent died for good (telemetry.on_agent_lost=stop): the
# run stopped at the next step, with its final checkpoint; relaunch to resume
EXIT_OUT_OF_MEMORY = 82  # a rank ran out of memory: said in one line with the settings to lower

USER_ERROR_EXITS = frozenset(
    {
        EXIT_CHECKPOINT_UNUSABLE,
        EXIT_RESUME_REFUSED,
        EXIT_NONFINITE,
        EXIT_RUN_DIR_BUSY,
        EXIT_TELEMETRY_LOST,
        EXIT_OUT_OF_MEMORY,
    }
)


class UserError(Exception):
    """One line for the user (what, and what to do) and the job's exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_CHECKPOINT_UNUSABLE):
        if exit_code not in USER_ERROR_EXITS:
            raise ValueError(f"exit status {exit_code} is not one of {sorted(USER_ERROR_EXITS)}")
        self.exit_code = exit_code
        super().__init__(" ".join(message.split()))  # one line, whatever the caller built
