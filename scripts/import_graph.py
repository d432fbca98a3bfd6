#!/usr/bin/env python3
"""The toolkit's import graph between its units (a package under toolkit/, or a top-level
module), read from the source with `ast`: every import counts, also one inside a function.

    python scripts/import_graph.py          # the graph, one unit per line, and the rules
    python scripts/import_graph.py --dot    # Graphviz: ... | dot -Tpng -o imports.png

Exits 1 when a layering rule is broken (tests/test_architecture.py asserts the same):
`config` imports nothing else of the toolkit; no cycle between units; `train` is imported by
neither `checkpoint` nor `telemetry`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "toolkit"


def unit_of(module: str) -> str | None:
    """'toolkit.config.shape' -> 'config'; 'toolkit.events' -> 'events'; else None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "toolkit" and len(parts) > 1 else None


def imported_modules(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x
                base = package.rsplit(".", node.level)[0]
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """unit -> the other units it imports."""
    edges: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        unit = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if unit == "__init__":
            continue
        targets = {unit_of(m) for m in imported_modules(path)}
        edges.setdefault(unit, set()).update(t for t in targets if t and t != unit)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's node list, found by depth-first search from each unit."""
    found: list[list[str]] = []
    seen_sets: set[frozenset[str]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                key = frozenset(path)
                if key not in seen_sets:
                    seen_sets.add(key)
                    found.append([*path, start])
            elif nxt not in path and nxt > start:  # each cycle once, from its smallest unit
                walk(start, nxt, [*path, nxt])

    for unit in sorted(edges):
        walk(unit, unit, [unit])
    return found


def broken_rules(edges: dict[str, set[str]]) -> list[str]:
    problems = [
        f"config imports {t} (config must import nothing of the runtime)"
        for t in sorted(edges.get("config", ()))
    ]
    problems += [f"cycle: {' -> '.join(c)}" for c in cycles(edges)]
    problems += [
        f"{u} imports train" for u in ("checkpoint", "telemetry") if "train" in edges.get(u, ())
    ]
    problems += [
        f"{u} imports bench (benchmarks sit on top; product code imports none)"
        for u in sorted(edges)
        if u != "bench" and "bench" in edges[u]
    ]
    return problems


def main(argv: list[str]) -> int:
    edges = graph()
    if "--dot" in argv:
        print("digraph toolkit {")
        for unit, targets in sorted(edges.items()):
            for target in sorted(targets):
                print(f'  "{unit}" -> "{target}";')
        print("}")
        return 0
    for unit, targets in sorted(edges.items()):
        print(f"{unit:12} -> {', '.join(sorted(targets)) or '-'}")
    problems = broken_rules(edges)
    print(
        "\n".join(f"rule broken: {p}" for p in problems)
        or "rules hold: config imports nothing of the runtime; no cycle; train not imported by checkpoint or telemetry; nothing imports bench"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
