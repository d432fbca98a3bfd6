"""Ensembles (trainer.ensemble=K): K members of one model trained at once in every rank.

One ensemble run of a user's model (tests/fixtures/userpkg, outside the toolkit) is shared
by the module: 4 members on 2 gloo ranks with their own seeds, learning rates, weight
decay and warm-up, one of them given a learning rate that makes it diverge. Each healthy
member trains the losses of its separate run, the plain run `seed=<member seed>
data.order_seed=<the ensemble's data order>` with the member's optimizer settings (no
trainer.members), to within 1e-5 relative; the diverging one is dropped while the others finish; every member is laid out,
listed, resumed and exported like a run of its own."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_module

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

FIXTURES = REPO / "tests" / "fixtures"
STEPS = 6
BASE = [
    "model._target_=userpkg.ensemble_models.WindowMLP",
    "model.num_series=3",
    "model.num_targets=2",
    "model.window=16",
    "model.hidden=16",
    "data=dataset",
    "data._target_=userpkg.datasets.NoisySeries",
    "+data.length=96",
    "+data.window=16",
    "+data.num_series=3",
    "+data.num_targets=2",
    "+data.seq_len=16",
    "+data.num_workers=0",
    "+data.val_fraction=0.25",
    f"trainer.steps={STEPS}",
    "trainer.global_batch_size=16",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "optim.warmup_steps=2",
    "checkpoint.enabled=true",
    "checkpoint.interval_steps=2",
    "checkpoint.keep_last=5",
]
# Different seeds, learning rates, weight decay and warm-up; "wild" diverges (lr 1e30).
MEMBERS = [
    {"seed": 3, "lr": 0.001},
    {"seed": 5, "lr": 0.01, "weight_decay": 0.0},
    {"name": "wild", "seed": 7, "lr": 1e30},
    {"seed": 11, "lr": 0.003, "warmup_steps": 0},
]
HEALTHY = {"m0": 0, "m1": 1, "m3": 3}
# Each run alone costs a 2-rank launch: two of the healthy three, between them a different
# seed, learning rate, weight decay and warm-up from the job's.
COMPARED = {"m1": 1, "m3": 3}


# A member's settings as the plain run's overrides (the ensemble's data order: its seed, 0)
PLAIN = {"seed": "seed", "lr": "optim.lr", "weight_decay": "optim.weight_decay"}
PLAIN |= {"warmup_steps": "optim.warmup_steps"}


def plain_run(member: dict) -> list[str]:
    return ["data.order_seed=0", *(f"{PLAIN[k]}={v}" for k, v in member.items())]


def as_override(members: list[dict]) -> str:
    items = (",".join(f"{k}:{v}" for k, v in m.items()) for m in members)
    return "+trainer.members=[" + ",".join("{" + i + "}" for i in items) + "]"


def launch(run_dir: Path, *overrides: str):
    paths = [str(REPO), str(FIXTURES), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    return run_module(
        "toolkit.launch", *BASE, *overrides, f"hydra.run.dir={run_dir}", env=env, timeout=240
    )


def member_losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ensemble") / "run"
    done = launch(run_dir, "trainer.ensemble=4", as_override(MEMBERS))
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_each_member_trains_the_losses_of_its_separate_run(ensemble, tmp_path):
    for name, index in COMPARED.items():
        alone = tmp_path / name
        done = launch(alone, *plain_run(MEMBERS[index]))  # seed=S data.order_seed=0 optim.lr=...
        assert done.returncode == 0, done.stderr[-3000:]
        got, want = member_losses(ensemble / "members" / name), member_losses(alone)
        assert sorted(got) == list(range(1, STEPS + 1))
        # vmap batches the members' matmuls and the gradients are averaged by an all-reduce
        # rather than FSDP2's reduce-scatter: the same arithmetic up to float reordering.
        assert got == pytest.approx(want, rel=1e-5), name
        summary = json.loads((ensemble / "members" / name / "summary.json").read_text())
        alone_summary = json.loads((alone / "summary.json").read_text())
        assert summary["val_loss"] == pytest.approx(alone_summary["val_loss"], rel=1e-5)
        if name == "m1":  # exported alone, the member is its separate run's model
            ours = export(ensemble, tmp_path / "ours.safetensors", "--member", "m1")
            theirs = export(alone, tmp_path / "theirs.safetensors")
            assert ours.keys() == theirs.keys()
            for key in ours:
                torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-6)


def export(run_dir: Path, out: Path, *args: str) -> dict[str, torch.Tensor]:
    done = run_module(
        "toolkit.cli", "export", str(run_dir), str(out), *args, env=dict(os.environ), timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from safetensors.torch import load_file

    return load_file(out)


@pytest.mark.slow
def test_a_diverging_member_is_dropped_while_the_others_finish(ensemble):
    wild = json.loads((ensemble / "members" / "wild" / "summary.json").read_text())
    dropped = wild["dropped_at_step"]
    assert 1 < dropped <= STEPS  # its first step applied lr 1e30; a later loss is non-finite
    assert sorted(member_losses(ensemble / "members" / "wild")) == list(range(1, dropped))
    run = json.loads((ensemble / "summary.json").read_text())
    assert run["stop_reason"] == "completed" and run["exit_code"] == 0
    assert run["members_dropped"] == {"wild": dropped}
    assert run["steps"] == STEPS
    for name in HEALTHY:
        summary = json.loads((ensemble / "members" / name / "summary.json").read_text())
        assert summary["dropped_at_step"] is None
        assert len(member_losses(ensemble / "members" / name)) == STEPS
    # the run's own record is the mean of the live members' losses
    after = member_losses(ensemble)[STEPS]
    healthy = [member_losses(ensemble / "members" / n)[STEPS] for n in HEALTHY]
    assert after == pytest.approx(sum(healthy) / len(healthy), rel=1e-6)


@pytest.mark.slow
def test_each_member_is_laid_out_and_listed_like_a_run(ensemble):
    member = ensemble / "members" / "m1"
    record = json.loads((member / "member.json").read_text())
    assert record == {
        "name": "m1",
        "index": 1,
        "seed": 5,
        "lr": 0.01,
        "weight_decay": 0.0,
        "warmup_steps": 2,
        "dropout": None,
        "data_seed": 0,  # the data order every member saw (the job's seed here)
    }
    run_summary = json.loads((ensemble / "summary.json").read_text())
    summary = json.loads((member / "summary.json").read_text())
    assert set(run_summary) <= set(summary)  # the run's schema, plus the member's fields
    assert (summary["member"], summary["seed"], summary["ensemble"]) == ("m1", 5, 4)
    for path in (member / "member.json", member / "summary.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = json.loads((member / "metrics" / "rank0.jsonl").read_text().splitlines()[0])
    assert first["lr"] == pytest.approx(0.01 * 0.5)  # its own lr, half-way up a 2-step warm-up
    done = run_module(
        "toolkit.cli", "runs", str(ensemble), "--json", env=dict(os.environ), timeout=60
    )
    assert done.returncode == 0, done.stderr
    rows = {row["run_dir"]: row for row in json.loads(done.stdout)}
    names = ("m0", "m1", "wild", "m3")
    assert set(rows) == {str(ensemble), *(str(ensemble / "members" / n) for n in names)}
    listed = rows[str(member)]
    assert (listed["state"], listed["steps"], listed["total_steps"]) == ("completed", 6, 6)
    assert listed["overrides"][:2] == ["member=m1", "seed=5"]
    assert rows[str(ensemble / "members" / "wild")]["state"] == "failed"
    # the whole stack is no plain model: an export names a member
    out = ensemble.parent / "all.safetensors"
    done = run_module(
        "toolkit.cli", "export", str(ensemble), str(out), env=dict(os.environ), timeout=60
    )
    assert done.returncode == 1 and not out.exists()
    assert done.stderr.strip() == (
        f"error: {ensemble}: an ensemble's run (trainer.ensemble=4), its tensors stacked over "
        "the members; export one with --member NAME (m0, m1, m3, wild)"
    )


@pytest.mark.slow
def test_a_resumed_ensemble_repeats_every_member_and_keeps_the_dropped_one_out(ensemble, tmp_path):
    source = ensemble / "checkpoints" / "step-00000004"
    done = launch(
        tmp_path / "resumed",
        "trainer.ensemble=4",
        as_override(MEMBERS),
        f"checkpoint.resume_from={source}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in HEALTHY:
        resumed = member_losses(tmp_path / "resumed" / "members" / name)
        assert sorted(resumed) == [5, 6]
        assert resumed == {s: member_losses(ensemble / "members" / name)[s] for s in resumed}
    wild = json.loads((tmp_path / "resumed" / "members" / "wild" / "summary.json").read_text())
    assert wild["dropped_at_step"] is not None


@pytest.mark.slow
def test_the_report_shows_each_members_loss_curve_and_row(ensemble, tmp_path):
    """`toolkit report` on an ensemble: a table of the members (name, seed, lr, final and
    validation loss, the step a dropped one dropped at) in the text, JSON and HTML report,
    and one plot with a line per member, a dropped member's ending at a cross."""
    from rich.console import Console

    from toolkit.config.telemetry import ReportConfig
    from toolkit.telemetry.report.build import build_report
    from toolkit.telemetry.report.members import losses, read_members
    from toolkit.telemetry.report.tables import print_report

    report = build_report(ensemble, tmp_path / "report", ReportConfig(sacct=False))
    dropped = json.loads((ensemble / "members" / "wild" / "summary.json").read_text())
    by_name = {m["name"]: m for m in report.members}
    assert list(by_name) == ["m0", "m1", "wild", "m3"]  # in member order
    assert [(m["seed"], m["lr"]) for m in report.members] == [(m["seed"], m["lr"]) for m in MEMBERS]
    assert by_name["wild"]["dropped_at_step"] == dropped["dropped_at_step"]
    for name in HEALTHY:
        summary = json.loads((ensemble / "members" / name / "summary.json").read_text())
        assert by_name[name]["final_loss"] == summary["final_loss"]
        assert by_name[name]["val_loss"] == summary["val_loss"]
        assert by_name[name]["dropped_at_step"] is None and by_name[name]["steps"] == STEPS
        curve = losses(ensemble / "members" / name)  # what its line is drawn from
        assert dict(curve) == member_losses(ensemble / "members" / name)
    assert [s for s, _ in losses(ensemble / "members" / "wild")] == list(
        range(1, dropped["dropped_at_step"])
    )

    saved = json.loads(Path(report.outputs["json"]).read_text())
    assert [m["name"] for m in saved["members"]] == ["m0", "m1", "wild", "m3"]
    png = Path(report.outputs["members_loss_png"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    page = Path(report.outputs["html"]).read_text()
    assert "<h2 id=members>Ensemble members</h2>" in page
    assert '<img alt="Loss per ensemble member"' in page
    assert "<td>wild</td><td>7</td><td>1e+30</td>" in page
    console = Console(width=200, record=True)
    print_report(report, console)
    text = console.export_text()
    assert "Ensemble members" in text
    (wild_row,) = [line for line in text.splitlines() if " wild " in line]
    assert wild_row.split("│")[1:-1][-1].strip() == str(dropped["dropped_at_step"])

    # Values of the wrong type in a member's files are shown as absent, never an error.
    damaged = tmp_path / "damaged"
    shutil.copytree(ensemble / "members", damaged / "members")
    (damaged / "members" / "m0" / "summary.json").write_text('{"final_loss": [1], "seed": "x"}')
    assert read_members(damaged)[0] | {"folder": None} == {
        **by_name["m0"],
        "final_loss": None,
        "val_loss": None,
        "folder": None,
    }
