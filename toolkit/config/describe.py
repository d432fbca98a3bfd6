"""What the schemas and YAML options say about themselves, for `--help`.

A field's help text is the comment beside it in toolkit/config/<group>.py, or the comment
lines right above it; they are read from the source with `tokenize`, so the schemas stay
plain dataclasses that read like documentation. An option's description is the first line
of its YAML's opening comment (`# @package` lines skipped), else the schema's docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import re
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FieldDoc:
    name: str
    type: str
    default: str
    help: str


@functools.cache
def _comments(path: str) -> dict[int, str]:
    """line number -> the text of the comment on that line."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def _field_lines(schema: type) -> dict[str, int]:
    """field name -> line number of its annotation in the source file."""
    lines, start = inspect.getsourcelines(schema)
    out = {}
    for offset, line in enumerate(lines):
        text = line.strip()
        name, sep, _ = text.partition(":")
        if sep and name.isidentifier() and line.startswith("    ") and not line.startswith("     "):
            out.setdefault(name, start + offset)
    return out


def _type_name(hint: object) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "???"


def field_docs(schema: type) -> list[FieldDoc]:
    """Every field of a schema dataclass: name, type, default and help text."""
    comments = _comments(inspect.getsourcefile(schema) or "")
    lines = _field_lines(schema)
    hints = typing.get_type_hints(schema)
    docs = []
    for f in dataclasses.fields(schema):
        line = lines.get(f.name)
        text = comments.get(line, "") if line else ""
        if line and not text:  # comment lines right above the field
            above = []
            n = line - 1
            while n in comments and not _is_code_line(schema, n):
                above.insert(0, comments[n])
                n -= 1
            text = " ".join(above)
        docs.append(FieldDoc(f.name, _type_name(hints[f.name]), _default(f), text))
    return docs


def _is_code_line(schema: type, line: int) -> bool:
    """Whether a commented line also holds code (a trailing comment of the field above)."""
    path = inspect.getsourcefile(schema) or ""
    text = Path(path).read_text(encoding="utf-8").splitlines()[line - 1]
    return not text.strip().startswith("#")


def schema_summary(schema: type) -> str:
    """First line of the schema's docstring, else of its module's."""
    own = schema.__doc__
    if own and own.startswith(schema.__name__ + "("):
        own = None  # the signature dataclasses write when there is no docstring
    module = inspect.getmodule(schema)
    text = own or (module.__doc__ if module else None) or ""
    return first_sentence(" ".join(text.strip().split("\n\n")[0].split()))


def option_summary(path: Path) -> str:
    """The first sentence of a YAML option's opening comment ('' when it has none)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if not text or text.startswith(("python ", "toolkit ")) or line.startswith("#  "):
            break
        lines.append(text)
    return first_sentence(" ".join(lines))


def first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence (not the one in "e.g." or "i.e.")."""
    return re.split(r"(?<!e\.g)(?<!i\.e)\.\s+", text)[0].rstrip(".:")
