"""Secrets given to a run (environment variables, setup lines, passwords in URLs) do not
reach what the run records about itself: env.json, launch.yaml, checkpoint config.json,
telemetry HDF5 attributes, NCCL records and logs. The one file that keeps them is
config.yaml, which every rank reads back to run the job; it is private to the user."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import launch
from toolkit.redact import (
    NOT_RECORDED,
    REDACTED,
    is_secret_name,
    redact,
    redact_env,
    redact_text,
)

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

SECRETS = ("sekrit123", "sekrit000", "sekrit456", "sekrit789")


@pytest.mark.parametrize(
    "name",
    ["MY_API_TOKEN", "DB_PASSWD", "GH_PAT", "REGISTRY_AUTH", "AWS_SECRET_ACCESS_KEY", "APIKEY"],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["PATH", "PYTHONPATH", "SSH_AUTH_SOCK", "tokens_per_s", "AUTHOR", "max_tokens"]
    # a Hugging Face config's fields: a key or token part that is not the last names no secret
    + ["num_key_value_heads", "bos_token_id", "pad_token_id"],
)
def test_names_that_only_look_alike_are_kept(name):
    assert not is_secret_name(name)


def test_a_password_in_a_url_is_redacted_and_the_rest_kept():
    assert redact_text("git clone https://u:sekrit789@host/x") == "git clone https://u:***@host/x"
    assert redact_text("ssh://git@github.com/a.git") == "ssh://git@github.com/a.git"


def test_secret_assignments_in_shell_lines_overrides_and_yaml_lose_their_value():
    assert redact_text("export HF_TOKEN=sekrit456 && run") == f"export HF_TOKEN={REDACTED} && run"
    assert redact_text('+nccl.env.MY_TOKEN="a b"') == f"+nccl.env.MY_TOKEN={REDACTED}"
    assert (
        redact_text("  DB_PASSWD: sekrit000\n  other: x") == f"  DB_PASSWD: {REDACTED}\n  other: x"
    )


def test_structures_are_redacted_by_key_and_by_value():
    config = {"env": {"MY_API_TOKEN": "x", "NCCL_X": "https://u:p@h"}, "setup": ["export A_KEY=1"]}
    assert redact(config) == {
        "env": {"MY_API_TOKEN": REDACTED, "NCCL_X": "https://u:***@h"},
        "setup": [f"export A_KEY={REDACTED}"],
    }
    assert redact_env({"B_PAT": "x", "PATH": "/bin"}) == {"B_PAT": REDACTED, "PATH": "/bin"}


def test_an_environment_keeps_values_only_for_the_families_that_say_how_the_job_ran():
    shell = {
        "DB_PASS": "sekrit1",  # names no rule tells from harmless ones
        "API_KEYS": "k1,k2",
        "SESSION_COOKIE": "abc",
        "ALERTS": "https://hooks.example.com/services/T0/B0/xyz",
        "SLURM_JOB_ID": "42",
        "NCCL_DEBUG": "WARN",
        "PYTHONPATH": "/src",
        "HOSTNAME": "n1",
        "OMP_NUM_THREADS": "4",
        "SLURM_JOB_COMMENT": "mlflow https://u:pw@host",  # kept, and still redacted
        "TORCH_HF_TOKEN": "sekrit2",
    }
    assert redact_env(shell) == {
        "ALERTS": NOT_RECORDED,
        "API_KEYS": REDACTED,  # a secret name: redacted before the allow-list is asked
        "DB_PASS": NOT_RECORDED,
        "HOSTNAME": "n1",
        "NCCL_DEBUG": "WARN",
        "OMP_NUM_THREADS": "4",
        "PYTHONPATH": "/src",
        "SESSION_COOKIE": NOT_RECORDED,
        "SLURM_JOB_COMMENT": "mlflow https://u:***@host",
        "SLURM_JOB_ID": "42",
        "TORCH_HF_TOKEN": REDACTED,
    }


def files_holding(run_dir: Path, secret: str) -> list[str]:
    """`grep -rl SECRET RUN_DIR` (binary files such as HDF5 included)."""
    found = subprocess.run(["grep", "-rl", secret, str(run_dir)], capture_output=True, text=True)
    return sorted(str(Path(p).relative_to(run_dir)) for p in found.stdout.split())


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_run_records_no_secret_outside_its_private_config(tiny, tmp_path):
    run_dir = tmp_path / "run"
    result = launch(
        *tiny,
        "checkpoint=periodic",
        "checkpoint.interval_steps=4",
        "cluster.setup=['export HF_TOKEN=sekrit456']",
        "nccl.env.NCCL_NET_PLUGIN='https://u:sekrit789@host/x'",
        f"hydra.run.dir={run_dir}",
        env={"MY_API_TOKEN": "sekrit123", "DB_PASSWD": "sekrit000", "DB_PASS": "sekrit321"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = {p.name for p in run_dir.rglob("*")}
    assert {"env.json", "launch.yaml", "config.json"} <= recorded
    assert any(name.endswith(".h5") for name in recorded), "telemetry is on by default"
    assert files_holding(run_dir, "sekrit123") == []  # environment
    assert files_holding(run_dir, "sekrit000") == []
    assert files_holding(run_dir, "sekrit321") == []  # a name no rule finds: not recorded
    environment = json.loads((run_dir / "env.json").read_text())["environment"]
    assert environment["DB_PASS"] == NOT_RECORDED and environment["PATH"] == os.environ["PATH"]
    # The job runs with these values: only config.yaml, which the ranks read back, keeps them.
    assert files_holding(run_dir, "sekrit456") == ["config.yaml"]
    assert files_holding(run_dir, "sekrit789") == ["config.yaml"]
    for secret in SECRETS:
        assert secret not in result.stdout + result.stderr
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(run_dir / "config.yaml").st_mode) == 0o600


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("python t.py --token sekrit1 --lr 3", f"python t.py --token {REDACTED} --lr 3"),
        ("python t.py --password 'a b' --lr 3", f"python t.py --password '{REDACTED}' --lr 3"),
        ("script.args=[--api-key,sekrit1,--lr,3]", f"script.args=[--api-key,{REDACTED},--lr,3]"),
        ("['--token', 'sekrit1']", f"['--token', '{REDACTED}']"),
        ("args:\n- --token\n- sekrit 1\n- --lr\n", f"args:\n- --token\n- {REDACTED}\n- --lr\n"),
        ("--api-key=sekrit1", f"--api-key={REDACTED}"),
        ("--token --lr 3 --tokens 5 --max-tokens 7", "--token --lr 3 --tokens 5 --max-tokens 7"),
    ],
)
def test_the_value_after_a_secret_flag_is_redacted_in_any_text(text, shown):
    assert redact_text(text) == shown


def test_an_argument_list_loses_the_value_after_a_secret_flag():
    args = ["--token", "sekrit1", "--password", "--lr", "3", "--api-key=k", "--tag", "x"]
    assert redact(args) == [
        "--token", REDACTED, "--password", "--lr", "3", f"--api-key={REDACTED}", "--tag", "x"
    ]  # fmt: skip
    assert redact({"script": {"args": ("--api-key", "sekrit1")}}) == {
        "script": {"args": ["--api-key", REDACTED]}
    }


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_secrets_in_script_args_reach_the_script_and_no_record(tmp_path):
    """`--token VALUE` and `--api-key VALUE`: the script gets both; the console, launch.yaml,
    the node telemetry, TensorBoard and mlflow.db do not (config.yaml keeps them for the
    ranks, as it does every value the job runs with)."""
    run_dir = tmp_path / "run"
    script = Path(__file__).parent / "fixtures" / "scripts" / "secret_args.py"
    result = launch(
        f"script.path={script}",
        "script.args=[--token,sekrit654,--api-key,sekrit987]",
        "cluster.tasks_per_node=1",
        "tracking=[tensorboard,mlflow]",
        f"hydra.run.dir={run_dir}",
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "received 456tirkes 789tirkes" in result.stdout  # the script got both as given
    recorded = {p.name for p in run_dir.rglob("*")}
    assert {"launch.yaml", "env.json", "mlflow.db"} <= recorded, recorded
    assert any(n.endswith(".h5") for n in recorded) and any("tfevents" in n for n in recorded)
    for secret in ("sekrit654", "sekrit987"):
        assert files_holding(run_dir, secret) == ["config.yaml"]
        assert secret not in result.stdout + result.stderr
