"""NaN passes every comparison, so each group refuses it (and negative values) by name:
one line before any rank starts, instead of a run that diverges or never times out."""

from __future__ import annotations

import pytest

from tests.config.test_validation import job
from toolkit.config.errors import ConfigError
from toolkit.config.validate import validate

REFUSED = [
    ("optim.lr=nan", "optim.lr=nan: must be a finite number > 0"),
    ("optim.lr=inf", "optim.lr=inf: must be a finite number > 0"),
    ("optim.grad_clip=-1", "optim.grad_clip=-1.0: must be a finite number >= 0 (0: no clipping)"),
    ("optim.grad_clip=nan", "optim.grad_clip=nan: must be a finite number >= 0 (0: no clipping)"),
    ("optim.beta2=1.0", "optim.beta2=1.0: must be a number in [0, 1) (e.g. 0.9, 0.95)"),
    ("optim.eps=nan", "optim.eps=nan: must be a finite number > 0 (e.g. 1e-8)"),
    ("optim.weight_decay=inf", "optim.weight_decay=inf: must be a finite number >= 0 (0: none)"),
    ("fault.hang_timeout_s=nan", "fault.hang_timeout_s=nan: must be a number"),
    ("fault.hang_timeout_s=-3", "fault.hang_timeout_s=-3.0: must be > 0 (or null: the default)"),
    (
        "trainer.time_budget_s=nan",
        "trainer.time_budget_s=nan: must be a positive number of seconds (or null)",
    ),
    (
        "trainer.time_budget_s=-1",
        "trainer.time_budget_s=-1.0: must be a positive number of seconds (or null)",
    ),
    (
        "trainer.target_val_loss=nan",
        "trainer.target_val_loss=nan: must be a finite number (or null)",
    ),
]


@pytest.mark.parametrize(("override", "message"), REFUSED, ids=[o for o, _ in REFUSED])
def test_nan_and_negative_values_are_refused_by_name(override, message) -> None:
    with pytest.raises(ConfigError) as err:
        validate(job(override))
    assert message in err.value.problems


def test_every_bad_adamw_setting_is_one_line_of_its_own() -> None:
    bad = ("optim.beta1=1.5", "optim.beta2=nan", "optim.eps=-1", "optim.weight_decay=nan")
    with pytest.raises(ConfigError) as err:
        validate(job(*bad))
    named = [line.split("=")[0] for line in err.value.problems if line.startswith("optim.")]
    assert named == ["optim.beta1", "optim.beta2", "optim.eps", "optim.weight_decay"]
    assert "optim.beta1=1.5: must be a number in [0, 1) (e.g. 0.9, 0.95)" in err.value.problems
    assert "optim.eps=-1.0: must be a finite number > 0 (e.g. 1e-8)" in err.value.problems
    validate(job("optim.beta1=0", "optim.eps=1e-6", "optim.weight_decay=0"))  # edges allowed


def test_an_optimizer_by_import_path_has_its_usual_keywords_checked_too() -> None:
    with pytest.raises(ConfigError) as err:
        validate(job("optim=sgd", "optim.weight_decay=nan", "optim.momentum=-1"))
    assert [line for line in err.value.problems if line.startswith("optim.")] == [
        "optim.weight_decay=nan: must be a finite number >= 0",
        "optim.momentum=-1: must be a finite number >= 0",
    ]
    adam = ("optim._target_=torch.optim.Adam", "~optim.momentum", "~optim.nesterov")
    with pytest.raises(ConfigError) as err:
        validate(job("optim=sgd", *adam, "+optim.betas=[0.9,1.5]", "+optim.eps=0"))
    assert [line for line in err.value.problems if line.startswith("optim.")] == [
        "optim.betas=[0.9, 1.5]: must be two numbers in [0, 1) (e.g. [0.9, 0.95])",
        "optim.eps=0: must be a finite number > 0 (e.g. 1e-8)",
    ]
    validate(job("optim=sgd", *adam, "+optim.betas=[0.9,0.99]"))


def test_a_batch_far_past_the_device_memory_is_refused_naming_the_largest_term() -> None:
    from toolkit.launch import RUNTIME_CHECKS

    with pytest.raises(ConfigError) as err:
        validate(job("model=gpt_tiny", "trainer.micro_batch_size=100000"), RUNTIME_CHECKS)
    (line,) = err.value.problems
    assert line.startswith("trainer.micro_batch_size=100000: does not fit: peak ")
    assert "largest term activations" in line and "(hardware=cpu: this host" in line
    validate(job("model=gpt_tiny", "trainer.micro_batch_size=8"), RUNTIME_CHECKS)  # fits
