#!/usr/bin/env python3
"""The toolkit's import graph between its units (a package under toolkit/, or a top-level
module) and between its modules (every toolkit/**/*.py), read from the source with `ast`.

Every import counts: at the top, inside a function, and under `if TYPE_CHECKING:` (a type
used in a signature is a dependency of meaning, even when it costs nothing at run time).
Two things do not: the body of `if __name__ == "__main__":` (it runs only when the module
is the program, as `__main__`, so importing from there closes no circle: e.g.
`python -m toolkit.perfmodel.counted` calls its CLI module), and the parent packages that
Python imports on the way to a module (`from toolkit.a.b import x` counts toolkit.a.b, not
toolkit.a's `__init__`, which re-exports; `from toolkit.a import x` counts toolkit.a).

    python scripts/import_graph.py          # the graph, one unit per line, and the rules
    python scripts/import_graph.py --dot    # Graphviz: ... | dot -Tpng -o imports.png

Exits 1 when a layering rule is broken (tests/test_architecture.py asserts the same):
`config` imports nothing else of the toolkit; no cycle between units; `train` is imported by
neither `checkpoint` nor `telemetry`. The cycles between modules are printed too
(tests/test_architecture.py holds that there are none).
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
    for node in walk_outside_main(ast.parse(path.read_text(), str(path))):
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


def walk_outside_main(tree: ast.AST):
    """ast.walk, leaving out the bodies of `if __name__ == "__main__":`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and ast.unparse(node.test) in MAIN_GUARDS:
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


MAIN_GUARDS = {"__name__ == '__main__'", "'__main__' == __name__"}


def module_name(path: Path, root: Path = ROOT) -> str:
    """toolkit/a/b.py -> 'toolkit.a.b'; toolkit/a/__init__.py -> 'toolkit.a'."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the other toolkit modules it imports."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {name: module_imports(path, name, set(paths)) - {name} for name, path in paths.items()}


def module_imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that the file of module `name` imports: `import a.b` and
    `from a import b` count a.b when it is a module; `from a.b import c`, c not a module,
    counts a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in walk_outside_main(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..a import x
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    found.add(full)
                elif base in modules:
                    found.add(base)
    return found


def module_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per circle of modules (a strongly connected component of more than one
    module, or a module importing itself), as a path from its smallest module back to it:
    the shortest such path. Sorted by that module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                components.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(_shortest_cycle(edges, c) for c in components)


def _shortest_cycle(edges: dict[str, set[str]], component: set[str]) -> list[str]:
    """Breadth-first, inside the component, from its smallest module back to it."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges.get(v, ()) & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError("a strongly connected component has a cycle")


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
    circles = module_cycles(module_graph())
    print("\n".join(f"module cycle: {' -> '.join(c)}" for c in circles) or "no module cycle")
    problems = broken_rules(edges)
    print(
        "\n".join(f"rule broken: {p}" for p in problems)
        or "rules hold: config imports nothing of the runtime; no cycle; train not imported by checkpoint or telemetry; nothing imports bench"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
