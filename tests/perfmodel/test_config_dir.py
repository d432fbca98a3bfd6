"""`toolkit.perfmodel`, `toolkit.plan` and `toolkit.perfmodel.counted` search `-cd DIR` /
`--config-dir DIR` first, as the launcher does (toolkit.config.sources): a model option of
your own, in your own directory, is found by all of them."""

from __future__ import annotations

import json

import pytest

from toolkit.perfmodel.__main__ import main as perfmodel
from toolkit.perfmodel.count_cli import main as counted
from toolkit.plan import main as plan

MY_GPT = """\
defaults:
  - gpt_schema
kind: gpt
name: my_gpt
num_layers: 3
dim: 96
num_heads: 4
"""


@pytest.fixture
def conf_dir(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my_gpt.yaml").write_text(MY_GPT)
    return str(tmp_path)


def test_perfmodel_reads_a_model_option_from_the_config_dir(conf_dir, capsys):
    assert perfmodel(["-cd", conf_dir, "--json", "model=my_gpt"]) == 0
    prediction = json.loads(capsys.readouterr().out)
    assert prediction["world_size"] >= 1
    assert perfmodel(["--config-dir", conf_dir, "model=my_gpt"]) == 0
    assert "my_gpt" in capsys.readouterr().out


def test_without_the_config_dir_the_option_is_unknown_in_one_line(capsys):
    assert perfmodel(["model=my_gpt"]) == 2
    err = capsys.readouterr().err
    assert "model=my_gpt: no such option" in err and len(err.splitlines()) == 1


def test_plan_reads_a_model_option_from_the_config_dir(conf_dir, capsys):
    assert plan(["-cd", conf_dir, "model=my_gpt", "--top", "1"]) == 0
    assert "my_gpt on" in capsys.readouterr().out


def test_counted_reads_a_model_option_from_the_config_dir(conf_dir, capsys):
    assert counted(["-cd", conf_dir, "--seq", "32", "my_gpt"]) == 0
    assert capsys.readouterr().out.startswith("my_gpt: ")
