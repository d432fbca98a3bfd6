"""`toolkit runs` shows the overrides that make a run differ from the defaults."""

from __future__ import annotations

from omegaconf import OmegaConf

from toolkit.cli.rundir import differing_overrides
from toolkit.config.compose import compose_raw, job_to_dict, to_job


def shown(*overrides: str) -> list[str]:
    cfg = compose_raw(list(overrides))
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    config = OmegaConf.create(job_to_dict(to_job(cfg)))
    return differing_overrides(list(overrides), choices, config)


def test_only_overrides_that_change_something_are_shown():
    assert shown(
        "data=text",  # the default option
        "model=gpt_tiny",
        "trainer.steps=300",  # the default value
        "trainer.steps=50",  # later overrides win: then it differs
        "hydra.run.dir=/tmp/x",
        "seed=3",
    ) == ["model=gpt_tiny", "trainer.steps=300", "trainer.steps=50", "seed=3"]


def test_a_value_equal_to_the_default_is_left_out():
    assert shown("trainer.steps=300", "optim.lr=0.003", "seed=0") == []
