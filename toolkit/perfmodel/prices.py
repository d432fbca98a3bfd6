"""The user's price table for cost estimates (`python -m toolkit.plan --cost`): a YAML mapping of hardware preset -> price per device-hour.
No price is built in: prices change and differ by contract."""

from __future__ import annotations

from pathlib import Path


def read_prices(path: Path) -> dict[str, float]:
    """The user's price table: hardware preset -> price per device-hour (no price is built
    in). Raises ValueError, one line, for a file that is not such a mapping."""
    from omegaconf import OmegaConf

    from toolkit.config.compose import group_options

    prices = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(prices, dict):
        raise ValueError(f"{path}: expected a mapping of hardware preset -> price per device-hour")
    unknown = [n for n in prices if n not in group_options("hardware")]
    if unknown:
        raise ValueError(f"{path}: hardware presets {unknown} unknown")
    try:
        return {str(k): float(v) for k, v in prices.items()}  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{path}: every price must be a number") from None
