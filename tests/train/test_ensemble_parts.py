"""An ensemble's parts in one process (toolkit.train.ensemble*): the built-in time-series
transformer stacked two members deep trains, step by step (two micro-batches each), what
each member's own model, torch's AdamW and the toolkit's clipping train alone; each member
drops at its own rate; a model vmap cannot batch and the settings an ensemble cannot
combine with are refused in one line each."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.optim import OptimConfig
from toolkit.config.trainer import TrainerConfig, member_names, member_problems
from toolkit.config.validate import problems
from toolkit.distributed.fsdp import clip_grad_norm_
from toolkit.errors import UserError
from toolkit.train.ensemble import as_member_optim, build_stack, resolve_members
from toolkit.train.ensemble_parts import build_ensemble
from toolkit.train.models.registry import spec_config, spec_for
from toolkit.train.optim import build_optimizer, build_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from userpkg.ensemble_models import WindowMLP  # noqa: E402  (a user's model, outside toolkit/)

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)
STEPS = 4


def tiny_ts():
    job = to_job(
        compose_raw(
            [
                "model=ts_transformer",
                "model.num_series=6",
                "model.num_targets=2",
                "model.num_layers=1",
                "model.dim=16",
                "model.num_heads=2",
                "data=returns",
            ]
        )
    )
    spec = spec_for(job.model)
    cfg = spec_config(job.model)

    def build() -> nn.Module:
        model = spec.build(cfg)
        spec.initialise(model)
        return model

    return spec, build


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 12, 6, generator=g), torch.randn(8, 2, generator=g)) for _ in range(n)]


@pytest.mark.slow
def test_each_stacked_transformer_member_steps_as_its_own_model_and_adamw(
    single_rank_group, tmp_path
):
    spec, build = tiny_ts()
    optim = OptimConfig(warmup_steps=2, schedule="cosine")
    trainer = TrainerConfig(
        steps=STEPS,
        ensemble=2,
        members=[
            {"seed": 4, "lr": 0.002},
            {"seed": 9, "lr": 0.01, "weight_decay": 0.0, "warmup_steps": 0},
        ],
    )
    cpu = torch.device("cpu")
    parts = build_ensemble(trainer, optim, 0, build, spec.loss_of, cpu, tmp_path, 0)
    data = batches(2 * STEPS)  # two micro-batches a step: gradient accumulation
    steps = [data[i : i + 2] for i in range(0, len(data), 2)]
    stacked_losses = []
    for micro_batches in steps:
        stacked_losses.append(parts.step.forward_backward(micro_batches).tolist())
        parts.step.clip_grad_norm(optim.grad_clip)
        parts.optimizer.step()
        parts.optimizer.zero_grad(set_to_none=True)
        parts.scheduler.step()
    for member in resolve_members(trainer, 0, optim):
        torch.manual_seed(member.seed)  # as task=train builds a separate run's model
        model = build()
        own = as_member_optim(optim, member)
        optimizer, losses = build_optimizer(model, own), []
        scheduler = build_scheduler(optimizer, own, STEPS)
        for micro_batches in steps:
            step_loss = 0.0
            for batch in micro_batches:
                loss = spec.loss_of(model, batch) / len(micro_batches)
                loss.backward()
                step_loss += loss.item()
            losses.append(step_loss)
            clip_grad_norm_(model, optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        got = [step[member.index] for step in stacked_losses]
        assert got == pytest.approx(losses, rel=1e-5), member.name
        mine = parts.stack.member_state(member.index)
        for key, value in model.state_dict().items():
            torch.testing.assert_close(mine[key], value, rtol=1e-5, atol=1e-6)
    parts.members.close()


class Running(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(self.lin(x))


def test_a_model_with_batchnorm_running_statistics_is_refused_in_one_line(tmp_path):
    members = resolve_members(TrainerConfig(ensemble=3), 0, OptimConfig())
    with pytest.raises(UserError) as refused:
        build_stack(Running, members, lambda m, b: m(b).sum(), torch.device("cpu"))
    assert str(refused.value) == (
        "model.norm: BatchNorm1d updates running statistics in place, which vmap cannot do "
        "per member; use LayerNorm or track_running_stats=False, or trainer.ensemble=1"
    )


def test_a_forward_vmap_cannot_run_per_member_is_refused_on_the_first_batch(
    single_rank_group, tmp_path
):
    class Branching(nn.Module):  # data-dependent control flow
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 1)

        def forward(self, x):
            y = self.lin(x).mean()
            return y if y > 0 else -y

    trainer = TrainerConfig(ensemble=2)
    cpu = torch.device("cpu")
    parts = build_ensemble(
        trainer, OptimConfig(), 0, Branching, lambda m, b: m(b), cpu, tmp_path, 0
    )
    with pytest.raises(UserError) as refused:
        parts.step.forward_backward([torch.randn(3, 4)])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("model: vmap cannot run it per member (")
    assert "remove in-place buffer updates and data-dependent control flow" in line
    parts.members.close()


def test_ensemble_settings_are_refused_before_any_rank_starts():
    base = ["model=gpt_tiny", "trainer.ensemble=4", "cluster.tasks_per_node=2"]
    found = problems(to_job(compose_raw([*base, "parallel.tp=2", "optim=sgd"])))
    assert (
        "parallel.tp=2 with trainer.ensemble=4: an ensemble keeps all members whole in each "
        "rank and combines with data parallelism only; set parallel.tp=1, or trainer.ensemble=1"
    ) in found
    assert any(
        p.startswith("optim=") and "use optim=adamw, or trainer.ensemble=1" in p for p in found
    )
    t = TrainerConfig(ensemble=2, members=[{"name": "a b", "lr": -1, "depth": 3}, {"name": "x"}])
    assert member_problems(t) == [
        "trainer.members[0]: unknown key(s) depth; allowed: name, seed, lr, weight_decay, "
        "warmup_steps, dropout",
        "trainer.members[0].name='a b': must be letters, digits, '.', '_' or '-'",
        "trainer.members[0].lr=-1: must be >= 0",
    ]
    assert member_problems(dataclasses.replace(t, members=[{}])) == [
        "trainer.members: 1 entries for trainer.ensemble=2; give one per member, or none "
        "(each member then takes the job's settings and seed + i)"
    ]
    assert member_names(32)[:2] == ["m00", "m01"] and member_names(4) == ["m0", "m1", "m2", "m3"]


def test_each_member_drops_at_its_own_rate_and_a_member_at_zero_is_unaffected(
    single_rank_group, tmp_path
):
    def build() -> nn.Module:
        return WindowMLP(num_series=6, num_targets=2, window=12, hidden=16, dropout=0.3)

    def loss(model, batch):
        x, y = batch
        return model.loss(model(x), y)

    trainer = TrainerConfig(
        steps=3, ensemble=2, members=[{"seed": 1, "dropout": 0.0}, {"seed": 2, "dropout": 0.5}]
    )
    optim = OptimConfig(warmup_steps=0)
    parts = build_ensemble(trainer, optim, 0, build, loss, torch.device("cpu"), tmp_path, 0)
    torch.manual_seed(1)
    alone = build()
    alone.drop.p = 0.0  # what trainer.ensemble=1 with members=[{seed: 1, dropout: 0.0}] runs
    for batch in batches(3):
        got = parts.step.forward_backward([batch])
        assert got[0].item() == pytest.approx(loss(alone, batch).item(), rel=1e-6)
        parts.optimizer.zero_grad(set_to_none=True)
    parts.stack.model.eval()  # evaluation: no member drops anything
    x, y = batches(1)[0]
    evaluated = parts.step.eval_batch((x, y), False)[0]
    torch.manual_seed(2)
    second = build().eval()
    assert evaluated[1].item() == pytest.approx(loss(second, (x, y)).item(), rel=1e-6)
    parts.members.close()
    with pytest.raises(UserError, match=r"trainer.members\[0\].dropout=0.1: the model has no"):
        build_stack(
            Running,
            resolve_members(TrainerConfig(ensemble=2, members=[{"dropout": 0.1}, {}]), 0, optim),
            lambda m, b: m(b).sum(),
            torch.device("cpu"),
        )


def test_trackers_get_each_members_values_under_its_name(tmp_path):
    from toolkit.events import Event, JsonlSink, StepRecord
    from toolkit.tracking.base import event_scalars
    from toolkit.train.ensemble_members import Members

    trainer = TrainerConfig(ensemble=2, members=[{"name": "fast", "lr": 0.01}, {}])
    members = Members(
        resolve_members(trainer, 0, OptimConfig()), tmp_path / "run", rank=0, data_seed=0
    )
    members.trackers = JsonlSink(tmp_path / "tracker", 0)  # what a tracker sink receives
    members.observe([0.5, 0.7], [1.0, 2.0], [False, False], step=1)
    record = StepRecord(1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.6, 1.5, 0.0, 16, 160.0, 0.0, 0)
    members.write_step(record, [0.01, 0.003])
    members.close()
    members.trackers.close()
    (line,) = (tmp_path / "tracker" / "events-rank0.jsonl").read_text().splitlines()
    scalars = event_scalars(Event(**json.loads(line)))
    assert scalars["event/members/fast/loss"] == 0.5
    assert scalars["event/members/m1/lr"] == 0.003
    own = (tmp_path / "run" / "members" / "fast" / "metrics" / "rank0.jsonl").read_text()
    assert json.loads(own)["loss"] == 0.5 and json.loads(own)["lr"] == 0.01


def test_precision_bf16_computes_under_autocast_and_keeps_fp32_weights(single_rank_group, tmp_path):
    def build() -> nn.Module:
        return WindowMLP(num_series=6, num_targets=2, window=12, hidden=16)

    def loss(model, batch):
        x, y = batch
        return model.loss(model(x), y)

    trainer, optim = TrainerConfig(ensemble=2), OptimConfig()
    cpu = torch.device("cpu")
    runs = {
        dtype: build_ensemble(trainer, optim, 0, build, loss, cpu, tmp_path / str(dtype), 0, dtype)
        for dtype in (torch.float32, torch.bfloat16)
    }
    batch = batches(1)[0]
    full, half = (runs[d].step.forward_backward([batch]) for d in (torch.float32, torch.bfloat16))
    assert half.dtype == torch.float32 and not torch.equal(full, half)  # bf16 arithmetic
    torch.testing.assert_close(half, full, rtol=2e-2, atol=1e-3)
    stacked = runs[torch.bfloat16].stack.model
    assert all(
        p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in stacked.parameters()
    )
    for parts in runs.values():
        parts.members.close()


class Tied(nn.Module):
    """An embedding and a head sharing one weight (as language models tie them)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids)).logsumexp(-1).mean()


def test_a_member_is_the_plain_models_state_dict_with_tied_weights_and_its_own_dropout():
    cpu = torch.device("cpu")
    members = resolve_members(TrainerConfig(ensemble=3), 0, OptimConfig())
    stack = build_stack(Tied, members, lambda m, b: m(b), cpu)
    assert len(list(stack.model.parameters())) == 1  # the tied weight is stacked once
    torch.manual_seed(members[2].seed)
    plain = Tied()
    plain.load_state_dict(stack.member_state(2), strict=True)
    ids = torch.tensor([[1, 2, 3]])
    assert stack.member_losses(ids)[2].item() == pytest.approx(plain(ids).item(), rel=1e-6)

    def build() -> nn.Module:
        return WindowMLP(num_series=6, num_targets=2, window=12, hidden=16, dropout=0.1)

    trainer = TrainerConfig(ensemble=2, members=[{"dropout": 0.2}, {"dropout": 0.4}])
    stack = build_stack(
        build, resolve_members(trainer, 0, OptimConfig()), lambda m, b: m(b[0]).sum(), cpu
    )
    build().load_state_dict(stack.member_state(1), strict=True)  # no dropout rate in it
