"""Hugging Face in and out: a transformers causal LM named on the command line alone
(`model.kind=hf_causal_lm model.config.*=...`), trained with tensor parallelism by
transformers' own published plan (the config class's base_model_tp_plan) to the same losses
as without it, and exported as a directory that `from_pretrained` loads with the trained
weights (config.json and model.safetensors). No download: a tiny Llama from its config."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import launch, losses
from toolkit.checkpoint.export import load_model_state, resolve_checkpoint
from toolkit.cli.export import main as export
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.model import HFModelConfig
from toolkit.config.parallel import problems as parallel_problems
from toolkit.train.models import hf

transformers = pytest.importorskip("transformers")

LLAMA = [
    "model.kind=hf_causal_lm",
    "model.config.model_type=llama",
    "model.config.vocab_size=256",
    "model.config.hidden_size=64",
    "model.config.intermediate_size=128",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.num_key_value_heads=2",
    "model.max_seq_len=64",
]
RUN = [
    "data.seq_len=32",
    "trainer.steps=4",
    "trainer.global_batch_size=8",
    "trainer.progress=false",
    "telemetry=off",
]


def test_model_kind_hf_causal_lm_composes_from_the_command_line():
    job = to_job(compose_raw(LLAMA))
    assert isinstance(job.model, HFModelConfig)
    assert job.model.config["num_key_value_heads"] == 2
    assert job.model.max_seq_len == 64


def test_a_key_another_kind_has_is_refused_with_this_kinds_keys():
    with pytest.raises(ConfigError) as refused:
        to_job(compose_raw(["model=gpt_small", "model.kind=hf_causal_lm"]))
    (line,) = refused.value.problems
    assert line == (
        "model.num_layers: unknown key 'num_layers' in model of kind hf_causal_lm; "
        "valid keys: kind, name, config, max_seq_len"
    )


def test_tensor_parallelism_needs_a_published_plan_and_even_widths():
    gpt2 = HFModelConfig(config={"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4})
    assert hf.tp_problems(gpt2, 2) == [
        "parallel.tp=2: model.config.model_type=gpt2 publishes no tensor-parallel plan "
        "(base_model_tp_plan)"
    ]
    job = to_job(compose_raw([*LLAMA, "model.config.num_key_value_heads=1"]))
    assert hf.tp_problems(job.model, 2) == [
        "parallel.tp=2 does not divide model.config.num_key_value_heads=1: each "
        "tensor-parallel rank needs an equal share"
    ]
    assert hf.tp_problems(to_job(compose_raw(LLAMA)).model, 2) == []
    # Meta-device init would seed each tp rank's copy of the (whole) embeddings its own way.
    meta = to_job(compose_raw([*LLAMA, "parallel.tp=2", "parallel.meta_init=true"]))
    assert parallel_problems(meta.parallel, 2, meta.model) == [
        "parallel.meta_init=true with parallel.tp=2: a Hugging Face model's embeddings stay "
        "whole on every tensor-parallel rank, and each rank would initialise its copy with "
        "its own seed; use parallel.meta_init=false"
    ]


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_tp2_trains_as_tp1_and_the_export_loads_with_from_pretrained(tmp_path):
    ckpt = ["checkpoint.enabled=true", "checkpoint.interval_steps=4"]
    whole = launch(*LLAMA, *RUN, f"hydra.run.dir={tmp_path / 'tp1'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    split = launch(*LLAMA, *RUN, *ckpt, "parallel.tp=2", f"hydra.run.dir={tmp_path / 'tp2'}")
    assert split.returncode == 0, split.stderr[-3000:]
    # Same global batch, each decoder layer's projections split over 2 ranks by the plan:
    # the same losses up to the order of float sums.
    assert losses(tmp_path / "tp2") == pytest.approx(losses(tmp_path / "tp1"), rel=1e-5)

    out = tmp_path / "hf"
    # The tensor-parallel run's checkpoint (logical keys and shapes), as a directory: auto
    assert export([str(tmp_path / "tp2"), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_key_value_heads == 2 and model.config.vocab_size == 256
    assert not info["missing_keys"] and not info["unexpected_keys"]
    trained = load_model_state(resolve_checkpoint(tmp_path / "tp2"))
    loaded = model.state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in trained.items())
    # The toolkit's own build of the run's model with the checkpoint's weights gives the
    # loaded model's logits bit for bit.
    ours = hf.build(to_job(compose_raw(LLAMA)).model)
    ours.load_state_dict(trained)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, ours(tokens).logits)


def test_an_hf_export_never_writes_into_a_directory_with_files(tmp_path):
    with pytest.raises(ValueError, match="not an empty directory"):
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "x").write_text("")
        hf.save_pretrained(HFModelConfig(config={"model_type": "llama"}), {}, tmp_path / "out")
