"""Own configs: directories searched before the package's conf/ add options to any group or
replace one; each still extends its group's schema. The order is package < site < user <
TOOLKIT_CONFIG_PATH < --config-dir < command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import REPO, isolated_env, toolkit
from toolkit.config.compose import compose_raw, to_job

EXAMPLES = REPO / "docs" / "examples" / "site-conf"


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return root


@pytest.fixture
def own(tmp_path) -> Path:
    """A user's config dir with a model, an experiment and a cluster preset."""
    root = tmp_path / "own"
    write(
        root,
        "model/my_tcn.yaml",
        "# My TCN-sized model.\ndefaults:\n  - model_schema\nname: my_tcn\ndim: 32\nnum_heads: 2\nnum_layers: 1\n",
    )
    write(
        root,
        "experiment/alpha17.yaml",
        "# @package _global_\n# Alpha 17.\ndefaults:\n  - override /model: my_tcn\ntrainer:\n  steps: 17\n",
    )
    write(
        root,
        "cluster/mysite.yaml",
        "# My site.\ndefaults:\n  - slurm\n  - override /nccl@_global_.nccl: infiniband\n"
        "  - override /hardware@_global_.hardware: h100\npartition: gpu\naccount: acct7\n",
    )
    return root


def test_a_user_dir_adds_a_model_an_experiment_and_a_cluster_preset(tmp_path, own):
    done = toolkit(
        tmp_path, "launch", "-cd", str(own), "--cfg", "job", "experiment=alpha17", "cluster=mysite"
    )
    assert done.returncode == 0, done.stderr
    job = done.stdout
    assert "name: my_tcn" in job and "steps: 17" in job
    assert "partition: gpu" in job and "account: acct7" in job and "kind: slurm" in job
    assert "profile: infiniband" in job and "name: h100" in job
    # --cfg job says which file every option came from
    assert f"# model: {own}/model/my_tcn.yaml (command-line)" in job
    assert f"# cluster: {own}/cluster/mysite.yaml (command-line)" in job
    assert f"# data: {REPO}/conf/data/text.yaml (package)" in job


def test_a_typo_in_a_user_file_is_the_same_one_line_error_as_on_the_command_line(tmp_path, own):
    write(own, "model/typo.yaml", "defaults:\n  - model_schema\nnum_layrs: 3\n")
    from_file = toolkit(tmp_path, "launch", "-cd", str(own), "--cfg", "job", "model=typo")
    from_cli = toolkit(tmp_path, "launch", "--cfg", "job", "model.num_layrs=3")
    assert from_file.returncode == from_cli.returncode == 2
    assert from_file.stderr.strip().splitlines() == from_cli.stderr.strip().splitlines()
    assert from_file.stderr.startswith(
        "error: model.num_layrs: unknown key 'num_layrs' in model; valid keys: kind, name,"
    )


def test_a_file_without_its_schema_is_still_checked(tmp_path, own):
    write(own, "model/noschema.yaml", "name: x\ndim: lots\n")
    done = toolkit(tmp_path, "launch", "-cd", str(own), "--cfg", "job", "model=noschema")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "model.dim" in done.stderr


def test_an_unknown_option_lists_the_user_options_too(tmp_path, own):
    done = toolkit(tmp_path, "launch", "-cd", str(own), "--cfg", "job", "model=nope")
    assert done.returncode == 2
    assert "allowed: gpt_125m" in done.stderr and "my_tcn" in done.stderr


def test_a_missing_config_dir_is_one_line(tmp_path):
    done = toolkit(tmp_path, "launch", "-cd", str(tmp_path / "nope"), "--cfg", "job")
    assert done.returncode == 2 and "no such directory" in done.stderr


def test_search_order_package_site_user_path_config_dir_command_line(
    tmp_path, no_site_dirs, monkeypatch
):
    """Each layer replaces trainer/default.yaml's steps; the highest present wins."""
    layers = {}
    for steps, name in enumerate(["site", "user", "path", "cd"], start=101):
        layers[name] = write(
            tmp_path / name,
            "trainer/default.yaml",
            f"defaults:\n  - trainer_schema\nsteps: {steps}\n",
        )

    def steps(config_dirs=(), overrides=()) -> int:
        return to_job(compose_raw(list(overrides), config_dirs)).trainer.steps

    package_steps = steps()
    monkeypatch.setenv("TOOLKIT_SITE_CONF", str(layers["site"]))
    assert steps() == 101
    monkeypatch.setenv("TOOLKIT_USER_CONF", str(layers["user"]))
    assert steps() == 102
    monkeypatch.setenv("TOOLKIT_CONFIG_PATH", f"{layers['path']}:{tmp_path / 'empty-but-listed'}")
    (tmp_path / "empty-but-listed").mkdir()
    assert steps() == 103
    assert steps([layers["cd"]]) == 104
    assert steps([layers["cd"]], ["trainer.steps=105"]) == 105
    assert package_steps not in (101, 102, 103, 104, 105)


def test_repeated_config_dirs_are_searched_in_the_order_given(tmp_path, no_site_dirs):
    a = write(tmp_path / "a", "trainer/default.yaml", "defaults:\n  - trainer_schema\nsteps: 1\n")
    b = write(tmp_path / "b", "trainer/default.yaml", "defaults:\n  - trainer_schema\nsteps: 2\n")
    assert to_job(compose_raw([], [a, b])).trainer.steps == 1
    assert to_job(compose_raw([], [b, a])).trainer.steps == 2


def test_the_site_dir_env_var_and_the_default_locations(tmp_path, monkeypatch):
    from toolkit.config import sources

    monkeypatch.delenv("TOOLKIT_SITE_CONF", raising=False)
    monkeypatch.delenv("TOOLKIT_USER_CONF", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert sources.site_conf_dir() == Path("/etc/toolkit/conf")
    assert sources.user_conf_dir() == tmp_path / "xdg" / "toolkit" / "conf"


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        ("gres", ["#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=8", "module load cuda/12.4"]),
        (
            "pyxis",
            ["#SBATCH --account=change-me", "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'"],
        ),
    ],
)
def test_the_site_examples_make_the_sbatch_script_they_promise(tmp_path, example, expected):
    env = isolated_env(tmp_path, TOOLKIT_SITE_CONF=str(EXAMPLES / example))
    done = toolkit(
        tmp_path,
        "launch",
        "cluster=mysite",
        "model=gpt_tiny",
        "checkpoint=periodic",
        "launch.dry_run=true",
        f"hydra.run.dir={tmp_path / 'run'}",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    for line in expected:
        assert line in done.stdout
    assert not (tmp_path / "run").exists()


def test_srun_extra_refuses_what_is_not_one_long_option(no_site_dirs):
    from toolkit.config.cluster import ClusterConfig, problems

    job = to_job(compose_raw(["cluster=slurm", "cluster.srun_extra=['--container-image=a b']"]))
    assert any("cluster.srun_extra" in p for p in problems(job.cluster))
    for bad in ["--x=\x1b[31m", "--x=a\nb", "-c", "container-image=x"]:
        found = problems(ClusterConfig(kind="slurm", srun_extra=[bad]))
        assert len(found) == 1 and found[0].startswith("cluster.srun_extra: "), bad
    assert (
        problems(
            ClusterConfig(
                kind="slurm", srun_extra=["--container-image=a#b:1", "--no-container-remap-root"]
            )
        )
        == []
    )
