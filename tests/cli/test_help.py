"""`--help` is reviewed text: golden files hold it (regenerate with UPDATE_GOLDEN=1 and read
the diff). It lists every group, option and field the config defines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, toolkit
from toolkit.config.compose import group_options
from toolkit.config.describe import field_docs
from toolkit.config.job import GROUPS

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

GOLDEN = REPO / "tests" / "golden"


def check_golden(name: str, text: str) -> None:
    text = text.replace(str(REPO), "<repo>")
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed: rerun with UPDATE_GOLDEN=1 and review"


def test_help_matches_its_golden_file(tmp_path):
    done = toolkit(tmp_path, "launch", "--help")
    assert done.returncode == 0, done.stderr
    check_golden("launch_help.txt", done.stdout)


def test_group_help_matches_its_golden_file(tmp_path):
    done = toolkit(tmp_path, "launch", "--help", "cluster")
    assert done.returncode == 0, done.stderr
    check_golden("launch_help_cluster.txt", done.stdout)


def test_bench_help_matches_its_golden_file(capsys):
    from toolkit.cli.main import run_bench

    assert run_bench(["--help"]) == 0
    check_golden("bench_help.txt", capsys.readouterr().out)


def test_bench_help_lists_every_benchmark_module():
    """Every `python -m toolkit.bench.X` (a module with a main) is a `toolkit bench` name."""
    from toolkit.cli.main import BENCHES

    listed = {module for module, _ in BENCHES.values()}
    root = REPO / "toolkit" / "bench"
    modules = {
        "toolkit." + ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for path in root.rglob("*.py")
        if "\ndef main(" in path.read_text()
    }
    assert modules and modules <= listed, sorted(modules - listed)


def test_help_names_every_group_and_option(tmp_path, no_site_dirs):
    from toolkit.config.help import launch_help
    from toolkit.config.sources import search_dirs

    text = launch_help(search_dirs())
    for group in [*GROUPS, "experiment"]:
        assert f"\n  {group}: " in text
        for option in group_options(group):
            assert f"\n    {option}" in text


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_field_has_a_type_and_default(group):
    docs = field_docs(GROUPS[group])
    assert [d.name for d in docs] == [f for f in GROUPS[group].__dataclass_fields__]
    assert all(d.type and d.default for d in docs)


def test_field_help_is_the_comment_beside_or_above_the_field():
    docs = {d.name: d for d in field_docs(GROUPS["cluster"])}
    assert docs["time"].help == "sbatch --time"
    assert docs["tasks_per_node"].help.startswith("Ranks per node.")
    assert docs["srun_extra"].help.startswith("Extra srun options")
    assert docs["nodes"].help == ""


def test_python_m_launch_help_is_the_same_text(tmp_path):
    via_module = toolkit(tmp_path, "launch", "-h").stdout
    assert via_module.startswith("toolkit launch: compose a training job")


@pytest.mark.slow
def test_cfg_package_and_resolve_print_one_subtree(tmp_path):
    done = toolkit(tmp_path, "launch", "--cfg", "job", "--package", "trainer", "trainer.steps=7")
    assert done.returncode == 0, done.stderr
    assert "# @package trainer" in done.stdout and "steps: 7" in done.stdout
    assert "model:" not in done.stdout.split("# @package trainer")[1]
    hydra = toolkit(tmp_path, "launch", "--cfg", "hydra", "--package", "hydra.run", "--resolve")
    assert "${now:" not in hydra.stdout and "dir: outputs/" in hydra.stdout
    unresolved = toolkit(tmp_path, "launch", "--cfg", "hydra", "--package", "hydra.run")
    assert "${now:" in unresolved.stdout
    bad = toolkit(tmp_path, "launch", "--resolve")
    assert bad.returncode == 2 and "--resolve" in bad.stderr


@pytest.mark.slow
def test_info_shell_completion_and_hydra_help(tmp_path):
    info = toolkit(tmp_path, "launch", "--info", "searchpath")
    assert info.returncode == 0 and "file://" + str(REPO / "conf") in info.stdout
    install = toolkit(tmp_path, "launch", "--shell-completion", "install=bash")
    assert "complete -o nospace -o default -F hydra_bash_completion toolkit" in install.stdout
    env = {**os.environ, "PYTHONPATH": str(REPO), "COMP_LINE": "toolkit launch model=gpt_t"}
    query = toolkit(tmp_path, "-sc", "query=bash", env=env)
    assert query.stdout.split() == ["model=gpt_tiny"]
    env["COMP_LINE"] = "python -m toolkit.launch trainer.ste"
    assert toolkit(tmp_path, "launch", "-sc", "query=bash", env=env).stdout.split() == [
        "trainer.steps="
    ]
    hydra_help = toolkit(tmp_path, "launch", "--hydra-help")
    assert hydra_help.returncode == 0 and "hydra/launcher: basic" in hydra_help.stdout


def test_golden_files_exist():
    assert Path(GOLDEN / "launch_help.txt").is_file()
    assert Path(GOLDEN / "bench_help.txt").is_file()
