"""Per-node telemetry (owned by the telemetry component; see toolkit/telemetry/)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TelemetryConfig:
    enabled: bool = False
    interval_s: float = 1.0
