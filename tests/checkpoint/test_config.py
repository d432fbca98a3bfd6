"""Checkpoint settings are validated at the edge, one line per problem."""

import pytest

from toolkit.config.checkpoint import CheckpointConfig
from toolkit.config.checkpoint import problems as validate_checkpoint
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.validate import validate
from toolkit.executors.preemption import classify, signal_number
from toolkit.slurm_records import parse_time


def test_every_checkpoint_option_composes():
    job = to_job(compose_raw(["checkpoint=periodic"]))
    assert job.checkpoint.enabled and job.checkpoint.interval_steps == 100
    assert validate_checkpoint(job.checkpoint) == []


def test_bad_values_are_named_with_what_is_allowed():
    cfg = CheckpointConfig(keep_last=0, on_corrupt="ignore", interval_steps=-1)
    assert validate_checkpoint(cfg) == [
        "checkpoint.interval_steps=-1: must be >= 0 (0: no interval)",
        "checkpoint.keep_last=0: must be >= 1 (the newest is always kept)",
        "checkpoint.on_corrupt=ignore: unknown; allowed: fallback, fail",
    ]


def test_the_launcher_rejects_them_before_any_rank_starts():
    job = to_job(compose_raw(["model=gpt_tiny", "checkpoint.on_save_error=retry"]))
    with pytest.raises(ConfigError, match="checkpoint.on_save_error=retry: unknown"):
        validate(job)


def test_timeout_is_told_from_preemption_by_the_jobs_end_time():
    now = 1_000_000.0
    assert classify(now + 100, now, lead_s=120) == "timeout"
    assert classify(now + 3600, now, lead_s=120) == "preemption"
    assert classify(None, now, lead_s=120) == "preemption"


def test_slurm_times_and_signal_names_parse():
    assert parse_time("Unknown") is None
    assert parse_time("2026-11-29T20:00:00") is not None
    assert signal_number("USR2") == signal_number("SIGUSR2") == 12
    with pytest.raises(ValueError, match="cluster.signal=BOGUS"):
        signal_number("BOGUS")
