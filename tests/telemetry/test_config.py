"""TelemetryConfig: on by default, bad values fail at composition with one line each."""

from __future__ import annotations

import pytest

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.telemetry import TelemetryConfig


def test_telemetry_is_on_by_default_at_one_second():
    job = to_job(compose_raw(["model=gpt_tiny"]))
    assert job.telemetry.enabled and job.telemetry.interval_s == 1.0


@pytest.mark.parametrize("option, enabled, interval", [("off", False, 1.0), ("fast", True, 0.1)])
def test_presets_compose(option, enabled, interval):
    job = to_job(compose_raw([f"telemetry={option}"]))
    assert (job.telemetry.enabled, job.telemetry.interval_s) == (enabled, interval)


def test_bad_values_are_reported_together_each_on_one_line():
    with pytest.raises(ConfigError) as info:
        to_job(compose_raw(["telemetry.interval_s=0.01", "telemetry.compression=zstd"]))
    assert info.value.problems == [
        "telemetry.interval_s=0.01: must be in [0.1, 3600] seconds",
        "telemetry.compression=zstd: allowed: gzip, lzf, none",
    ]


def test_interval_down_to_a_tenth_of_a_second_is_allowed():
    assert TelemetryConfig(interval_s=0.1).interval_s == 0.1


def test_values_below_their_minimum_are_named_with_the_minimum():
    with pytest.raises(ConfigError) as info:
        TelemetryConfig(chunk_rows=8, max_pending=-1, close_timeout_s=-0.5)
    assert info.value.problems == [
        "telemetry.chunk_rows=8: must be >= 16",
        "telemetry.max_pending=-1: must be >= 0",
        "telemetry.close_timeout_s=-0.5: must be >= 0",
    ]


def test_what_a_lost_agent_does_is_one_of_continue_or_stop():
    assert TelemetryConfig().on_agent_lost == "continue"
    with pytest.raises(ConfigError) as info:
        to_job(compose_raw(["telemetry.on_agent_lost=restart"]))
    assert info.value.problems == [
        "telemetry.on_agent_lost=restart: unknown; allowed: continue, stop"
    ]
