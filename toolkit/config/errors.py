"""Config errors that reach the user as one line each, never as a traceback."""

from __future__ import annotations

import unicodedata


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


SWITCH = ("auto", "on", "off")


def switch(value: object) -> str | None:
    """An auto | on | off setting as one of those three, or None when it is none of them.
    YAML reads a bare on/off as a boolean and Hydra writes a boolean into a str field as
    'True'/'False', so true and false mean on and off."""
    text = str(value).lower()
    return {"true": "on", "false": "off"}.get(text, text if text in SWITCH else None)


def switch_problems(section: str, cfg: object, names: tuple[str, ...]) -> list[str]:
    """One line per auto | on | off field of `cfg` that is none of them."""
    return [
        f"{section}.{name}={getattr(cfg, name)}: unknown; allowed: auto, on, off"
        for name in names
        if switch(getattr(cfg, name)) is None
    ]


def _is_control(ch: str) -> bool:
    # Cc: C0 (newline, tab, NUL, ...), DEL and C1; Zl/Zp: the Unicode line/paragraph separators.
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp")


def control_characters(text: str) -> list[str]:
    """The control characters in `text`, each once, escaped: 'a\nb\tc' -> ['\\t', '\\n']."""
    return [repr(ch)[1:-1] for ch in sorted({ch for ch in text if _is_control(ch)})]


def shown(value: object) -> str:
    """A value for a one-line message, its control characters escaped ('a\nb' stays one line)."""
    return "".join(repr(ch)[1:-1] if _is_control(ch) else ch for ch in str(value))


def control_problem(name: str, value: str) -> list[str]:
    """'<name>=<value>: contains control character(s) ...' when `value` has any, else []."""
    found = control_characters(value)
    if not found:
        return []
    return [
        f"{name}={shown(value)}: contains control character(s) {' '.join(found)}; values "
        "written into generated scripts and files must be printable text on one line; remove them"
    ]
