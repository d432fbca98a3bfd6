"""Every config group option and every experiment composes into a valid JobConfig."""

from __future__ import annotations

import pytest

from toolkit.config.compose import compose_raw, group_options, to_job
from toolkit.config.job import GROUPS, JobConfig
from toolkit.config.validate import validate

ALL_OPTIONS = [(g, o) for g in GROUPS for o in group_options(g)]


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert group_options(group), f"conf/{group}/ has no YAML option"


@pytest.mark.parametrize(("group", "option"), ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_group_option_composes(group: str, option: str) -> None:
    overrides = [f"{group}={option}"]
    if group == "model" and option == "ts_transformer":
        overrides.append("data=returns")
    if group == "data" and option == "returns":
        overrides.append("model=ts_transformer")
    if group == "data" and option == "dataset":  # your own Dataset: named by import path
        overrides.append("data._target_=torch.utils.data.TensorDataset")
    # The options that name your own object need the object (or a registered kind).
    if (group, option) == ("model", "target"):
        overrides.append("model._target_=torch.nn.Linear")
    if (group, option) == ("optim", "target"):
        overrides.append("optim._target_=torch.optim.SGD")
    if (group, option) == ("model", "plugin"):
        overrides.append("model.kind=my_registered_model")
    if group == "parallel" and option == "hsdp":
        overrides.append("cluster.tasks_per_node=4")
    job = to_job(compose_raw(overrides))
    assert isinstance(job, JobConfig)
    if group != "cluster":
        validate(job)


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_experiment_composes_and_validates(experiment: str) -> None:
    job = to_job(compose_raw([f"experiment={experiment}"]))
    validate(job)
    assert job.trainer.steps >= 1


def test_presets_have_realistic_shapes() -> None:
    from toolkit.train.flops import param_counts

    def total(name: str) -> float:
        return param_counts(to_job(compose_raw([f"model={name}"])).model)["total"]

    assert 120e6 < total("gpt_125m") < 170e6
    assert 1.2e9 < total("gpt_1b") < 1.5e9
    assert 6.5e9 < total("gpt_7b") < 7.5e9


def test_overrides_reach_the_typed_config() -> None:
    job = to_job(
        compose_raw(
            [
                "model=gpt_125m",
                "trainer.steps=50",
                "trainer.micro_batch_size=4",
                "trainer.grad_accum=2",
                "precision=bf16",
                "parallel.activation_checkpointing=true",
                "parallel.compile=true",
                "cluster.tasks_per_node=2",
                "seed=3",
            ]
        )
    )
    assert job.model.num_layers == 12 and job.model.dim == 768
    assert (job.trainer.steps, job.trainer.micro_batch_size, job.trainer.grad_accum) == (50, 4, 2)
    assert job.precision.param_dtype == "bfloat16" and job.precision.reduce_dtype == "float32"
    assert job.parallel.activation_checkpointing and job.parallel.compile
    assert job.cluster.tasks_per_node == 2 and job.seed == 3
