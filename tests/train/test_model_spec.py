"""The model contract in-process: how a config names a model and its spec, which modules
FSDP2 shards, how a micro-batch becomes a loss, and what a bad setting says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from toolkit.config.compose import compose_raw, job_to_dict, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.model import (
    GPTConfig,
    PluginModelConfig,
    TargetModelConfig,
    TimeSeriesConfig,
    problems,
)
from toolkit.errors import UserError
from toolkit.train.models import builtin, target
from toolkit.train.models.registry import spec_for
from toolkit.train.models.spec import batch_size, repeated_children, to_device

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from userpkg.models import LSTMForecaster, LSTMLayer  # noqa: E402


def lstm_node(**extra) -> TargetModelConfig:
    kwargs = {"num_series": 6, "num_targets": 2, "hidden": 8, **extra}
    return TargetModelConfig(target="userpkg.models.LSTMForecaster", kwargs=kwargs)


def test_a_target_node_keeps_settings_and_arguments_apart_and_round_trips():
    job = to_job(
        compose_raw(
            ["model._target_=userpkg.models.LSTMForecaster", "model.hidden=8", "model.loss=mse"]
        )
    )
    assert isinstance(job.model, TargetModelConfig)
    assert job.model.target == "userpkg.models.LSTMForecaster"
    assert job.model.kwargs == {"hidden": 8}
    assert job.model.loss == "mse"  # a toolkit setting, not a constructor argument
    written = job_to_dict(job)["model"]
    assert written == {
        "_target_": "userpkg.models.LSTMForecaster",
        "hidden": 8,
        "name": "",
        "loss": "mse",
        "units": [],
        "max_seq_len": 0,
    }
    again = to_job(OmegaConf.create(job_to_dict(job)))  # config.yaml, read back by every rank
    assert again.model == job.model


def test_each_built_in_kind_has_its_own_schema_and_a_plugin_kind_its_options():
    assert isinstance(to_job(compose_raw(["model=gpt_tiny"])).model, GPTConfig)
    ts = to_job(compose_raw(["model=ts_transformer", "data=returns"])).model
    assert isinstance(ts, TimeSeriesConfig) and not hasattr(ts, "vocab_size")
    with pytest.raises(ConfigError, match="model.num_series: unknown key"):
        to_job(compose_raw(["model=gpt_tiny", "model.num_series=3"]))
    plugin = to_job(compose_raw(["model.kind=my_lstm", "model.hidden=64"])).model
    assert plugin == PluginModelConfig("my_lstm", "my_lstm", {"hidden": 64})


def test_a_bad_target_setting_is_one_line_each():
    bad = TargetModelConfig(target="no-dots", loss="l3", units=["nodots"])
    assert problems(bad) == [
        "model._target_='no-dots': not an import path; use module.attribute, e.g. "
        "mypkg.models.LSTMForecaster",
        "model.loss=l3: unknown; allowed: auto, mse, huber, cross_entropy or the import path "
        "of a function (output, targets) -> loss",
        "model.units: 'nodots' is not an import path (module.Class)",
    ]


def test_fsdp_units_are_the_models_layers():
    lstm = LSTMForecaster(6, 2, hidden=8, num_layers=3)
    assert repeated_children(lstm) == list(lstm.layers)
    gpt = builtin.GPT_SPEC.build(GPTConfig())
    assert builtin.GPT_SPEC.units_of(gpt) == list(gpt.blocks.values())
    named = target.spec(lstm_node(units=["userpkg.models.LSTMLayer"]))
    assert all(isinstance(u, LSTMLayer) for u in named.units_of(lstm))
    assert repeated_children(nn.Linear(2, 2)) == []  # no layers: the root is the one unit


def test_hf_units_are_its_decoder_layers():
    from toolkit.config.model import HFModelConfig
    from toolkit.train.models import hf

    cfg = HFModelConfig(
        config={
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        }
    )
    model = hf.SPEC.build(cfg)
    assert hf.SPEC.units_of(model) == list(model.model.layers)
    inputs = torch.randint(0, 64, (2, 5))
    loss = hf.SPEC.loss_of(model, (inputs, inputs))
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_the_loss_conventions_of_a_model_of_yours():
    torch.manual_seed(0)
    lstm = LSTMForecaster(6, 2, hidden=8)
    x, y = torch.randn(3, 5, 6), torch.randn(3, 2)
    own = target.spec(lstm_node()).loss_of(lstm, (x, y))  # its loss(output, targets) method
    assert own == lstm.loss(lstm(x), y)
    mse = target.spec(lstm_node(loss="mse")).loss_of(lstm, (x, y))
    assert mse == torch.nn.functional.mse_loss(lstm(x), y)
    by_path = TargetModelConfig(target="x.Y", loss="torch.nn.functional.l1_loss")
    assert target.spec(by_path).loss_of(lstm, (x, y)) == (lstm(x) - y).abs().mean()

    class ReturnsLoss(nn.Module):  # forward(inputs, targets) -> loss
        def forward(self, inputs, targets):
            return (inputs.mean() - targets.mean()) ** 2

    auto = TargetModelConfig(target="x.Y")
    assert target.spec(auto).loss_of(ReturnsLoss(), (x, y)).dim() == 0

    class DictModel(nn.Module):  # forward(**batch) -> an object with .loss (as HF returns)
        def forward(self, input_ids, labels):
            return type("Out", (), {"loss": (input_ids.float() - labels.float()).pow(2).mean()})

    batch = {"input_ids": torch.ones(2, 3), "labels": torch.zeros(2, 3)}
    assert target.spec(auto).loss_of(DictModel(), batch) == 1.0


def test_a_model_that_returns_predictions_without_a_loss_says_what_to_do():
    plain = nn.Linear(6, 2)
    with pytest.raises(UserError, match="forward takes the inputs alone needs a loss"):
        target.spec(TargetModelConfig(target="x.Y")).loss_of(
            plain, (torch.randn(3, 6), torch.randn(3, 2))
        )
    with pytest.raises(UserError, match="not a scalar loss: return the loss"):
        target.spec(TargetModelConfig(target="x.Y")).loss_of(plain, torch.randn(3, 6))
    with pytest.raises(UserError, match="needs \\(inputs, targets\\) micro-batches"):
        target.spec(TargetModelConfig(target="x.Y", loss="mse")).loss_of(plain, torch.ones(2, 6))


def test_any_batch_moves_to_the_device_and_knows_its_size():
    batch = {"x": torch.ones(4, 2), "meta": [torch.zeros(4), "name"], "n": 3}
    moved = to_device(batch, torch.device("cpu"))
    assert moved["meta"][1] == "name" and moved["n"] == 3
    assert batch_size(batch) == 4
    assert batch_size((torch.ones(5, 1), torch.ones(5))) == 5
    with pytest.raises(TypeError, match="holds no tensor"):
        batch_size({"n": 3})


def test_the_registry_names_the_known_kinds_for_an_unknown_one():
    with pytest.raises(UserError, match="model.kind=nosuch: unknown; known kinds: gpt"):
        spec_for(PluginModelConfig("nosuch", "nosuch", {}))
    assert spec_for(TimeSeriesConfig()).unit == "samples"
    assert spec_for(GPTConfig()).unit == "tokens"
