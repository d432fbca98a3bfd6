"""A value that would write its own line into the sbatch script is a config error: the
launcher exits 2 with one line per problem and submits nothing.

A newline in `cluster.partition` used to become a second `#SBATCH` line (any option the value
chose); a CR, NUL or tab is refused the same way, wherever the value comes from (an override,
a YAML file, an `${oc.env:...}` interpolation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.executors.test_slurm_dry_run import check_golden
from toolkit import launch
from toolkit.config.cluster import ClusterConfig, slurm_problems

AWKWARD = {
    "newline": "debug\n#SBATCH --foo=1",
    "carriage return": "debug\r#SBATCH --foo=1",
    "nul": "debug\x00",
    "tab": "debug\tgpu",
}
# Every string of the cluster config that the sbatch script or the srun line includes.
FIELDS = [
    "partition",
    "account",
    "qos",
    "constraint",
    "exclude",
    "job_name",
    "mem",
    "time",
    "signal",
    "python",
]


def refused(capsys, tmp_path: Path, *overrides: str) -> list[str]:
    """Launch for real (not a dry run): the exit code must be 2 and nothing may be written."""
    run_dir = tmp_path / "run"
    code = launch.main(["cluster=slurm", "model=gpt_tiny", f"hydra.run.dir={run_dir}", *overrides])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == "", "nothing is printed as submitted"
    assert not run_dir.exists(), "nothing is written before validation passes"
    return err.splitlines()


@pytest.mark.parametrize("value", AWKWARD.values(), ids=AWKWARD.keys())
def test_a_control_character_in_any_sbatch_field_is_one_error_line_each(capsys, tmp_path, value):
    quoted = "'" + value + "'"
    overrides = [f"cluster.{name}={quoted}" for name in FIELDS]
    overrides += [f"cluster.setup=[{quoted}]", f"cluster.sbatch_extra=[{quoted}]"]
    lines = refused(capsys, tmp_path, *overrides)
    assert len(lines) == len(overrides)
    for line, override in zip(lines, overrides, strict=True):
        assert line.startswith(f"error: {override.split('=')[0]}=")
        assert "control character" in line


def test_the_refusal_lines_read_as_recorded(capsys, tmp_path):
    value = "'" + AWKWARD["newline"] + "'"
    lines = refused(
        capsys,
        tmp_path,
        f"cluster.partition={value}",
        f"cluster.setup=['module load cuda',{value}]",
    )
    check_golden("slurm_refused_values.txt", "\n".join(lines) + "\n")


def test_values_from_the_environment_or_yaml_are_checked_too(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TK_PARTITION", AWKWARD["newline"])
    monkeypatch.setenv("TK_SETUP", "export A=1\rexport B=2")
    lines = refused(
        capsys,
        tmp_path,
        "cluster.partition=${oc.env:TK_PARTITION}",
        "cluster.setup=[${oc.env:TK_SETUP}]",
    )
    assert lines == [
        "error: cluster.partition=debug\\n#SBATCH --foo=1: contains control character(s) \\n; "
        "values written into generated scripts and files must be printable text on one line; "
        "remove them",
        "error: cluster.setup[0]=export A=1\\rexport B=2: contains control character(s) \\r; "
        "values written into generated scripts and files must be printable text on one line; "
        "remove them",
    ]


def test_a_run_dir_with_a_newline_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUN_DIR", str(tmp_path / "run\n#SBATCH --foo=1"))
    code = launch.main(["cluster=slurm", "model=gpt_tiny", "hydra.run.dir=${oc.env:TK_RUN_DIR}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"error: hydra.run.dir={tmp_path}/run\\n#SBATCH --foo=1: contains control character(s) "
        "\\n; values written into generated scripts and files must be printable text on one "
        "line; remove them"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("partition", "debug gpu"),
        ("partition", "gpu;touch /tmp/x"),
        ("account", "$(id)"),
        ("qos", "high'"),
        ("constraint", "a100 && ib"),
        ("exclude", "node1 node2"),
    ],
)
def test_single_token_fields_hold_only_what_slurm_accepts(field, value):
    problems = slurm_problems(ClusterConfig(kind="slurm", **{field: value}))
    assert problems == [
        next(p for p in problems if p.startswith(f"cluster.{field}={value}: not what Slurm"))
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("partition", "gpu,debug"),
        ("account", "ml-research_2"),
        ("qos", "high"),
        ("constraint", "[rack1|rack2]&a100*2"),
        ("exclude", "node[01-04,07],gpu3"),
    ],
)
def test_ordinary_slurm_values_are_accepted(field, value):
    assert slurm_problems(ClusterConfig(kind="slurm", **{field: value})) == []
