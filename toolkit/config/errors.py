"""Config errors that reach the user as one line each, never as a traceback."""

from __future__ import annotations


class ConfigError(ValueError):
    """One or more problems with the user's configuration; each line names field, value and
    what is allowed."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def below_minimum(section: str, cfg: object, minimums: dict[str, int]) -> list[str]:
    """One line per field of `cfg` below its minimum: '<section>.<field>=<value>: must be >= N'."""
    return [
        f"{section}.{name}={getattr(cfg, name)}: must be >= {low}"
        for name, low in minimums.items()
        if getattr(cfg, name) < low
    ]


def not_one_of(section: str, cfg: object, choices: dict[str, tuple[str, ...]]) -> list[str]:
    """One line per field of `cfg` outside its choices: '<section>.<field>=<value>: unknown;
    allowed: a, b'."""
    return [
        f"{section}.{name}={getattr(cfg, name)}: unknown; allowed: " + ", ".join(allowed)
        for name, allowed in choices.items()
        if getattr(cfg, name) not in allowed
    ]
