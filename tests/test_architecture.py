"""The layering rules hold: contracts at the bottom, composition at the top.

The graph is read from the source by scripts/import_graph.py (every import counts, also one
inside a function); run it to see the whole graph.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.config.job import GROUPS

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "import_graph.py"


@pytest.fixture(scope="module")
def imports():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_imports_nothing_of_the_runtime(imports):
    assert imports.graph()["config"] == set()


def test_no_cycle_between_packages(imports):
    assert imports.cycles(imports.graph()) == []


def test_no_cycle_between_modules(imports):
    """No two toolkit modules import each other, directly or around a circle; every import
    counts (top level, in a function, under TYPE_CHECKING), see scripts/import_graph.py."""
    found = imports.module_cycles(imports.module_graph())
    for cycle in found:
        print("module cycle:", " -> ".join(cycle))
    assert found == []


def test_a_module_cycle_is_found_and_shown_by_its_shortest_path(imports):
    edges = {
        "a": {"b"},
        "b": {"c", "a2"},
        "a2": {"a"},
        "c": {"a"},
        "d": {"a", "d"},
        "e": set(),
    }
    # a, b, c, a2 form one circle, shown once; d imports itself.
    assert imports.module_cycles(edges) == [["a", "b", "a2", "a"], ["d", "d"]]


def test_module_imports_resolve_names_modules_and_relative_imports(imports, tmp_path):
    package = tmp_path / "toolkit" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from toolkit.pkg.low import Thing\n")
    (package / "low.py").write_text("Thing = 1\n")
    (package / "high.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import low\n"
        "if TYPE_CHECKING:\n    from toolkit.pkg import Thing\n"
        "def f():\n    import toolkit.pkg.other\n"
        "if __name__ == '__main__':\n    from toolkit.pkg.cli import main\n"
    )
    (package / "other.py").write_text("from toolkit.pkg.low import Thing\n")
    (package / "cli.py").write_text("from toolkit.pkg.high import f\n")
    assert imports.module_graph(tmp_path / "toolkit") == {
        "toolkit.pkg": {"toolkit.pkg.low"},
        "toolkit.pkg.low": set(),
        "toolkit.pkg.high": {"toolkit.pkg.low", "toolkit.pkg", "toolkit.pkg.other"},
        "toolkit.pkg.other": {"toolkit.pkg.low"},
        "toolkit.pkg.cli": {"toolkit.pkg.high"},  # high's __main__ block is not counted
    }


def test_training_is_imported_by_neither_checkpointing_nor_telemetry(imports):
    edges = imports.graph()
    assert "train" not in edges["checkpoint"]
    assert "train" not in edges["telemetry"]


def test_no_product_package_imports_the_benchmarks(imports):
    """Benchmarks sit on top: the hardware profile, the model check and the planner's check are
    product code (toolkit.measure), and nothing of the product imports toolkit.bench."""
    assert [unit for unit, targets in imports.graph().items() if "bench" in targets] == []


def test_the_contracts_sit_at_the_bottom(imports):
    """Step records, events, sinks, exit statuses and the hook contract depend on nothing of
    the toolkit but each other."""
    edges = imports.graph()
    assert edges["events"] == set()
    assert edges["errors"] == set()
    assert edges["hooks"] <= {"events", "errors"}


def test_a_cycle_is_found_when_there_is_one(imports):
    assert imports.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c", "a"]
    ]
    assert imports.broken_rules(
        {"config": {"train"}, "checkpoint": {"train"}, "train": set(), "plan": {"bench"}}
    ) == [
        "config imports train (config must import nothing of the runtime)",
        "checkpoint imports train",
        "plan imports bench (benchmarks sit on top; product code imports none)",
    ]


def test_the_script_says_the_rules_hold():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout
    assert "rules hold" in done.stdout


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_config_group_validates_itself_with_one_problems_function(group):
    module = importlib.import_module(f"toolkit.config.{group}")
    assert callable(getattr(module, "problems", None)), f"toolkit/config/{group}.py: no problems()"
