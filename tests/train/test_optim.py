"""Optimizers and learning-rate schedules: the four schedules by hand values, any torch.optim
optimizer by import path (with the decay / no-decay parameter groups), the checks that catch
a bad one before any rank starts, and a resumed schedule that takes this run's learning rate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from toolkit.config import optim as optim_config
from toolkit.config.compose import compose_raw, to_job
from toolkit.config.optim import OptimConfig, OptimTargetConfig
from toolkit.train.optim import build_optimizer, build_scheduler, lr_factor
from toolkit.train.targets import optimizer_problems


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        # 10 steps, no warm-up, down to 0 (wsd: the last 20 % = 2 steps decay)
        ("constant", 0, 1.0),
        ("constant", 9, 1.0),
        ("linear", 0, 1.0),
        ("linear", 5, 0.5),
        ("linear", 10, 0.0),
        ("cosine", 0, 1.0),
        ("cosine", 5, 0.5),
        ("cosine", 10, 0.0),
        ("wsd", 7, 1.0),
        ("wsd", 8, 1.0),
        ("wsd", 9, 0.5),
        ("wsd", 10, 0.0),
    ],
)
def test_each_schedule_by_hand(schedule, step, expected):
    assert lr_factor(step, 10, schedule) == pytest.approx(expected)


def test_warm_up_then_the_schedule_over_the_remaining_steps_to_min_ratio():
    args = {"warmup_steps": 2, "min_ratio": 0.1}
    assert lr_factor(0, 12, "cosine", **args) == 0.5  # (step + 1) / warmup
    assert lr_factor(1, 12, "constant", **args) == 1.0
    assert lr_factor(7, 12, "cosine", **args) == pytest.approx(0.55)  # half-way: 0.1 + 0.9 / 2
    assert lr_factor(7, 12, "linear", **args) == pytest.approx(0.55)
    assert lr_factor(12, 12, "linear", **args) == pytest.approx(0.1)
    # wsd: 50 % of 12 = 6 decay steps, from step 6 on
    assert lr_factor(6, 12, "wsd", decay_fraction=0.5, **args) == 1.0
    assert lr_factor(9, 12, "wsd", decay_fraction=0.5, **args) == pytest.approx(0.55)


def test_a_torch_optimizer_by_import_path_gets_decay_and_no_decay_groups():
    job = to_job(compose_raw(["optim=sgd", "optim.weight_decay=0.01"]))
    assert isinstance(job.optim, OptimTargetConfig) and job.optim.target == "torch.optim.SGD"
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
    optimizer = build_optimizer(model, job.optim)
    assert type(optimizer) is torch.optim.SGD
    decayed, plain = optimizer.param_groups
    assert [p.dim() for p in decayed["params"]] == [2]
    assert decayed["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    assert decayed["momentum"] == 0.9 and decayed["nesterov"] is True and decayed["lr"] == 0.1


def test_your_own_optimizer_file_with_its_keyword_arguments_and_a_schedule(tmp_path):
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "radam.yaml").write_text(
        "_target_: torch.optim.RAdam\nlr: 0.002\nbetas: [0.8, 0.9]\nschedule: wsd\n"
        "warmup_steps: 1\nno_decay_1d: false\n"
    )
    job = to_job(compose_raw(["optim=radam", "++optim.decay_fraction=0.5"], [tmp_path]))
    assert optim_config.problems(job.optim) == [] and optimizer_problems(job, 2) == []
    model = nn.Linear(4, 8)
    optimizer = build_optimizer(model, job.optim)
    assert type(optimizer) is torch.optim.RAdam and len(optimizer.param_groups) == 1
    assert optimizer.param_groups[0]["betas"] == [0.8, 0.9]  # plain data, not OmegaConf's
    scheduler = build_scheduler(optimizer, job.optim, total_steps=4)
    seen = []
    for _ in range(4):
        seen.append(scheduler.get_last_lr()[0])
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    # warm-up 1 step; decay over the last 2 of 4 steps down to 0.1 x
    assert seen == pytest.approx([0.002, 0.002, 0.002, 0.002 * 0.55])


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (["optim._target_=SGD"], "optim._target_='SGD': not an import path"),
        (["optim.lr=-1"], "optim.lr=-1: must be a finite number > 0"),
        (["optim.schedule=step"], "optim.schedule=step: unknown; allowed: constant, linear"),
        (["optim.decay_fraction=0"], "optim.decay_fraction=0.0: must be in (0, 1]"),
    ],
)
def test_a_bad_optimizer_node_is_one_line(overrides, problem):
    job = to_job(compose_raw(["optim=sgd", *overrides]))
    [line] = optim_config.problems(job.optim)
    assert line.startswith(problem)


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("torch.nn.Linear", "not a torch.optim.Optimizer subclass"),
        ("nosuchpkg.Optimizer", "cannot import it (ModuleNotFoundError"),
    ],
)
def test_the_launcher_checks_that_the_optimizer_imports_and_is_one(target, problem):
    job = to_job(compose_raw(["optim=sgd", f"optim._target_={target}"]))
    [line] = optimizer_problems(job, 2)
    assert line.startswith(f"optim._target_={target}: ") and problem in line


def test_the_adamw_variants_take_a_schedule_too():
    job = to_job(compose_raw(["optim.schedule=wsd", "optim.warmup_steps=0"]))
    assert isinstance(job.optim, OptimConfig) and optim_config.problems(job.optim) == []
    optimizer = build_optimizer(nn.Linear(4, 8), job.optim)
    scheduler = build_scheduler(optimizer, job.optim, total_steps=10)
    assert scheduler.lr_lambdas[0](9) == pytest.approx(lr_factor(9, 10, "wsd", 0, 0.1, 0.2))


def test_a_resumed_schedule_keeps_its_position_and_takes_this_runs_lr_and_steps():
    """The scheduler and optimizer states of a run at step 3 (peak lr 0.01 over 10 steps),
    loaded into a run configured with lr 0.001 over 20 steps: the next lr is 0.001 times
    the new schedule's factor at step 3, not the checkpoint's."""
    torch.manual_seed(0)
    model = nn.Linear(4, 8)
    old = OptimConfig(lr=0.01, warmup_steps=0)
    optimizer = build_optimizer(model, old)
    scheduler = build_scheduler(optimizer, old, total_steps=10)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    saved_optimizer, saved_scheduler = optimizer.state_dict(), scheduler.state_dict()

    new = OptimConfig(lr=0.001, warmup_steps=0)
    optimizer = build_optimizer(model, new)
    scheduler = build_scheduler(optimizer, new, total_steps=20)
    optimizer.load_state_dict(saved_optimizer)  # brings back the old lr in its param_groups
    scheduler.load_state_dict(saved_scheduler)
    expected = 0.001 * lr_factor(3, 20, "cosine", 0, 0.1)
    assert scheduler.last_epoch == 3
    assert scheduler.get_last_lr() == pytest.approx([expected, expected])
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([expected, expected])
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.001 * lr_factor(4, 20, "cosine", 0, 0.1))
