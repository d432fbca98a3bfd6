"""Pipeline stages of a model, in one process: which layers go where, and that the stages
chained together compute exactly what the whole model does, under the whole model's
parameter names."""

from __future__ import annotations

import torch

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.model import GPTConfig, TimeSeriesConfig
from toolkit.config.parallel import MeshShape, ParallelConfig
from toolkit.tasks.train import pipeline_split
from toolkit.train.models import build_model
from toolkit.train.pipeline import stage_ids, stage_layers


def job(*overrides: str):
    return to_job(compose_raw(list(overrides)))


def test_stage_layers_follow_pp_split_or_the_performance_model() -> None:
    explicit = job("parallel.pp=2", "parallel.pp_split=[4,2]", "model.num_layers=6")
    shape = MeshShape(pp=2)
    assert stage_layers(pipeline_split(explicit, shape)) == [[0, 1, 2, 3], [4, 5]]
    virtual = job(
        "parallel.pp=2",
        "parallel.pp_schedule=interleaved_1f1b",
        "parallel.pp_virtual_stages=2",
        "model.num_layers=8",
    )
    assert [len(s) for s in stage_layers(pipeline_split(virtual, shape))] == [2] * 4
    # gpt with a 50k vocabulary: the head outweighs a small layer, the last stage is lighter
    big_vocab = job("parallel.pp=2", "model.num_layers=6", "model.vocab_size=50304")
    split = stage_layers(pipeline_split(big_vocab, shape))
    assert len(split[0]) > len(split[1])
    assert stage_ids(1, 2, 2) == [1, 3] and stage_ids(0, 4, 1) == [0]


def _chain(model, layers, x):
    full_keys = set(model.state_dict())
    last = len(layers) - 1
    parts = [model.part(ls, first=s == 0, last=s == last) for s, ls in enumerate(layers)]
    for part in parts:
        assert set(part.state_dict()) <= full_keys  # the logical names, on every stage
        x = part(x)
    assert set().union(*(part.state_dict() for part in parts)) == full_keys
    return x


def test_gpt_stages_chained_equal_the_whole_model_bitwise() -> None:
    torch.manual_seed(0)
    model = build_model(GPTConfig(num_layers=4))
    model.reset_parameters()
    tokens = torch.randint(0, 256, (2, 16))
    whole = model(tokens)
    assert torch.equal(_chain(model, [[0], [1, 2], [3]], tokens), whole)
    parts = [model.part([0, 1], True, False), model.part([2, 3], False, True)]
    assert "blocks.2.attn.qkv_heads.weight" in parts[1].state_dict()
    assert parts[1].tok_emb is None and parts[0].head is None
    assert parts[1].blocks["2"] is model.blocks["2"]  # shared, not copied


def test_time_series_stages_chained_equal_the_whole_model_bitwise() -> None:
    torch.manual_seed(0)
    model = build_model(TimeSeriesConfig(num_layers=2, num_series=5))
    model.reset_parameters()
    series = torch.randn(3, 12, 5)
    assert torch.equal(_chain(model, [[0], [1]], series), model(series))


def test_interleaved_micro_batches_must_split_into_rounds() -> None:
    from toolkit.config.parallel import problems

    par = ParallelConfig(pp=2, pp_schedule="interleaved_1f1b", pp_virtual_stages=2)
    assert problems(par, 2, GPTConfig(num_layers=4), grad_accum=4) == []
    [line] = problems(par, 2, GPTConfig(num_layers=4), grad_accum=5)
    assert line.startswith("parallel.pp_schedule=interleaved_1f1b: trainer.grad_accum=5")
