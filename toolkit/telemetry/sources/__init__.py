"""Samplers of node-level metrics. Each source reports the tables it will fill
(`specs()`), one row per table per `sample(now)`, and when it cannot run, why
(`absent_reason`); then its tables are left out of the file."""

from __future__ import annotations

from typing import Any, Protocol

from toolkit.telemetry.schema import TableSpec


class Source(Protocol):
    name: str
    absent_reason: str | None

    def specs(self) -> list[TableSpec]: ...

    def sample(self, now: float) -> dict[str, dict[str, Any]]:
        """table path -> row (column -> value); time is added by the caller."""
        ...

    def events(self, now: float) -> list[dict[str, Any]]:
        """Node events seen since the last call (e.g. GPU XID errors)."""
        ...

    def close(self) -> None: ...


class Rate:
    """Per-second rate of a monotonic counter from consecutive readings (NaN at the first
    reading and when the counter goes backwards: reset or wrap)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}

    def __call__(self, key: str, now: float, value: float | None) -> float:
        if value is None:
            return float("nan")
        prev = self._last.get(key)
        self._last[key] = (now, value)
        if prev is None or now <= prev[0] or value < prev[1]:
            return float("nan")
        return (value - prev[1]) / (now - prev[0])
