"""Config errors that reach the user as one line each, never as a traceback."""

from __future__ import annotations


class ConfigError(ValueError):
    """One or more problems with the user's configuration; each line names field, value and
    what is allowed."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))
