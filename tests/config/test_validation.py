"""Bad input is refused before any rank starts: exit 2, one line naming field, value and what
is allowed, no traceback."""

from __future__ import annotations

import pytest

from tests.conftest import launch
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.shape import global_batch_size, micro_batch_size
from toolkit.config.validate import validate

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def job(*overrides: str):
    return to_job(compose_raw(list(overrides)))


BAD_INPUTS = [
    (["model=gpt_huge"], "model=gpt_huge: no such option in group 'model'; allowed: gpt_125m"),
    (["trainer.steps=many"], "trainer.steps=many: wrong type; expected integer"),
    (["trainer.stepz=3"], "trainer.stepz: unknown key 'stepz' in trainer; valid keys: steps"),
    (
        ["trainer.global_batch_size=6", "trainer.grad_accum=2"],
        "trainer.global_batch_size=6: must be a positive multiple of data-parallel ranks (the world size over tp x pp) x grad_accum = 2 x 2 = 4",
    ),
    (
        ["data.seq_len=1024"],
        "data.seq_len=1024: above the model's maximum sequence length (model.max_seq_len=512)",
    ),
    (["cluster.tasks_per_node=0"], "cluster.tasks_per_node=0: must be >= 1"),
    (
        ["hardware=tpu_v9"],
        "hardware=tpu_v9: no such option in group 'hardware'; allowed: a100, cpu, h100, h200",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUTS, ids=[o[0] for o, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(overrides: list[str], message: str, tmp_path) -> None:
    result = launch(*overrides, f"hydra.run.dir={tmp_path / 'run'}", timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists(), "nothing may be written before validation passes"


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        validate(job("data.seq_len=4096", "optim.lr=-1", "model.num_heads=5"))
    text = str(err.value)
    assert "data.seq_len=4096" in text and "optim.lr=-1" in text and "model.dim=192" in text


BELOW_MINIMUM = [
    ("cluster.signal_lead_s=-5", "cluster.signal_lead_s=-5: must be >= 0"),
    ("data.seq_len=1", "data.seq_len=1: must be >= 2"),
    ("trainer.steps=0", "trainer.steps=0: must be >= 1"),
    ("trainer.grad_accum=0", "trainer.grad_accum=0: must be >= 1"),
    ("trainer.micro_batch_size=0", "trainer.micro_batch_size=0: must be >= 1"),
    ("optim.warmup_steps=-1", "optim.warmup_steps=-1: must be >= 0"),
    ("collectives.baseline_repeats=0", "collectives.baseline_repeats=0: must be >= 1"),
]


@pytest.mark.parametrize(("override", "message"), BELOW_MINIMUM, ids=[o for o, _ in BELOW_MINIMUM])
def test_a_value_below_its_minimum_is_one_line_naming_the_minimum(override, message) -> None:
    with pytest.raises(ConfigError) as err:
        validate(job(override))
    assert err.value.problems == [message]


def test_global_batch_decides_the_micro_batch() -> None:
    j = job("trainer.global_batch_size=16", "trainer.grad_accum=2", "cluster.tasks_per_node=2")
    validate(j)
    assert micro_batch_size(j.trainer, 2) == 4 and global_batch_size(j.trainer, 2) == 16


def test_micro_batch_times_accum_times_world_is_the_global_batch() -> None:
    j = job("trainer.micro_batch_size=3", "trainer.grad_accum=5")
    assert global_batch_size(j.trainer, 4) == 60


def test_time_series_model_needs_returns_data() -> None:
    with pytest.raises(ConfigError, match="model=ts_transformer needs data=returns"):
        validate(job("model=ts_transformer"))


def test_hsdp_replicate_must_divide_world() -> None:
    with pytest.raises(
        ConfigError,
        match=r"parallel: pp=1 x dp_replicate=2 x tp=1 = 2 does not divide the world size 3",
    ):
        validate(job("parallel=hsdp", "cluster.tasks_per_node=3"))


@pytest.mark.slow
def test_cfg_job_prints_the_resolved_config() -> None:
    result = launch("--cfg", "job", "model=gpt_125m", "trainer.steps=7", timeout=60)
    assert result.returncode == 0, result.stderr
    assert (
        "steps: 7" in result.stdout and "dim: 768" in result.stdout and "hydra" not in result.stdout
    )


def test_rollback_without_checkpoints_warns_that_it_would_stop() -> None:
    with pytest.warns(UserWarning, match="nothing to roll back to"):
        validate(job("trainer.on_nonfinite=rollback"))
