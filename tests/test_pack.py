"""Packing a -m sweep into ensembles (launch.pack=auto): which runs share a pack, which do
not and why, what the pack's job gets, and the pointer each packed run's own dir keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit import pack
from toolkit.config.compose import job_to_dict
from toolkit.config.job import JobConfig
from toolkit.config.launch import LaunchConfig, problems
from toolkit.config.trainer import PACKABLE
from toolkit.launch import expand, main, pack_sweep, prepare


def run(index: int, overrides: list[str], job: JobConfig) -> pack.SweepRun:
    return pack.SweepRun(index, overrides, job_to_dict(job), pack.not_packable(job))


def job(**changes) -> JobConfig:
    """A default job with dotted changes: job(**{'optim.lr': 0.01, 'seed': 3})."""
    j = JobConfig()
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = j
        for part in parents:
            node = getattr(node, part)
        setattr(node, last, value)
    return j


def sweep(*changes: dict) -> list[pack.SweepRun]:
    runs = []
    for i, c in enumerate(changes):
        runs.append(run(i, [f"{k}={v}" for k, v in c.items()], job(**c)))
    return runs


def test_runs_differing_in_lr_and_seed_share_one_pack_one_member_each():
    runs = sweep(*({"optim.lr": lr, "seed": s} for lr in (1e-3, 3e-3) for s in (0, 1)))
    (only,) = pack.group(runs, PACKABLE)
    assert only.packed and only.reason == ""
    assert only.members == [
        {"name": "r0", "seed": 0, "lr": 1e-3},
        {"name": "r1", "seed": 1, "lr": 1e-3},
        {"name": "r2", "seed": 0, "lr": 3e-3},
        {"name": "r3", "seed": 1, "lr": 3e-3},
    ]
    # The pack's job: its first run's overrides plus these (Hydra's grammar); the seeds
    # differ, so the data order every member sees is stated: the first run's seed.
    assert only.ensemble_overrides() == [
        "trainer.ensemble=4",
        "trainer.members=[{name:r0,seed:0,lr:0.001},{name:r1,seed:1,lr:0.001},"
        "{name:r2,seed:0,lr:0.003},{name:r3,seed:1,lr:0.003}]",
        "++data.order_seed=0",
    ]


def test_the_packer_sets_data_seed_so_each_member_equals_a_plain_run():
    runs = sweep({"seed": 1, "optim.lr": 0.1}, {"seed": 2, "optim.lr": 0.1})
    (only,) = pack.group(runs, PACKABLE)
    assert (only.data_seed, only.sets_data_seed) == (1, True)
    assert only.ensemble_overrides()[-1] == "++data.order_seed=1"
    # member r1 (seed 2) saw the batches of seed 1: the plain run it equals says so
    assert only.equals(runs[1]) == "seed=2 optim.lr=0.1 data.order_seed=1"
    assert pack.pack_table([only], ["pack0"])[1] == (
        "  data order: seed 1 (data.order_seed) for every member"
    )


def test_a_sweeps_own_data_seed_is_kept_and_one_seed_needs_no_data_seed():
    given = sweep({"seed": 1, "data.order_seed": 7}, {"seed": 2, "data.order_seed": 7})
    (only,) = pack.group(given, PACKABLE)
    assert (only.data_seed, only.sets_data_seed) == (7, False)
    assert not any("data.order_seed" in o for o in only.ensemble_overrides())
    assert only.equals(given[1]) == "seed=2 data.order_seed=7"
    same = sweep({"seed": 3, "optim.lr": 0.1}, {"seed": 3, "optim.lr": 0.2})
    (only,) = pack.group(same, PACKABLE)
    assert (only.data_seed, only.sets_data_seed) == (3, False)  # the job's seed orders it
    assert pack.pack_table([only], ["pack0"])[1] == "  data order: seed 3 (seed) for every member"


def test_runs_of_another_data_order_are_not_packed_together():
    runs = sweep({"seed": 0, "data.order_seed": 1}, {"seed": 0, "data.order_seed": 2})
    first, second = pack.group(runs, PACKABLE)
    assert not first.packed and not second.packed
    assert second.reason == "differs from pack 0 in data.order_seed (another data order)"


def test_a_setting_that_does_not_vary_is_left_to_the_job_and_the_seed_is_always_given():
    runs = sweep({"seed": 5, "optim.weight_decay": 0.1}, {"seed": 6, "optim.weight_decay": 0.1})
    (only,) = pack.group(runs, PACKABLE)
    assert only.members == [{"name": "r0", "seed": 5}, {"name": "r1", "seed": 6}]


def test_runs_of_another_shape_go_to_another_pack_which_says_why():
    runs = sweep(
        {"seed": 0, "trainer.micro_batch_size": 8},
        {"seed": 0, "trainer.micro_batch_size": 16},
        {"seed": 1, "trainer.micro_batch_size": 8},
        {"seed": 1, "trainer.micro_batch_size": 16},
    )
    first, second = pack.group(runs, PACKABLE)
    assert [r.index for r in first.runs] == [0, 2]
    assert [r.index for r in second.runs] == [1, 3]
    assert second.reason == "differs from pack 0 in trainer.micro_batch_size"
    assert [m["name"] for m in second.members] == ["r1", "r3"]


def test_many_differences_are_counted_not_all_listed():
    a, b = job(), job(**{"trainer.steps": 5, "trainer.log_every": 1, "data.seq_len": 32})
    b.trainer.grad_accum, b.trainer.eval_batches = 2, 1
    packs = pack.group([run(0, [], a), run(1, [], b)], PACKABLE)
    assert packs[1].reason == (
        "differs from pack 0 in data.seq_len, trainer.eval_batches, trainer.grad_accum and 2 more"
    )


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"task": "bench_train"}, "task=bench_train: only training runs are packed"),
        ({"parallel.tp": 2}, "parallel.tp=2: an ensemble cannot have it"),
        ({"trainer.ensemble": 4}, "trainer.ensemble=4: an ensemble already"),
    ],
)
def test_a_run_that_cannot_be_a_member_stays_a_run_of_its_own(change, reason):
    runs = sweep({"seed": 0, **change}, {"seed": 1, **change})
    packs = pack.group(runs, PACKABLE)
    assert [(p.packed, p.reason) for p in packs] == [(False, reason), (False, reason)]
    assert all(p.ensemble_overrides() == [] for p in packs)


def test_the_table_says_which_run_went_where_with_the_overrides_the_sweep_varies():
    runs = sweep(
        {"optim.lr": 0.1, "trainer.micro_batch_size": 8},
        {"optim.lr": 0.2, "trainer.micro_batch_size": 8},
        {"optim.lr": 0.1, "trainer.micro_batch_size": 4},
    )
    for r in runs:
        r.overrides.insert(0, "launch.pack=auto")  # common to all: not repeated per run
    packs = pack.group(runs, PACKABLE)
    assert pack.pack_table(packs, ["pack0", "2"]) == [
        "pack0: 2 members",
        "  data order: seed 0 (seed) for every member",
        "  [0] optim.lr=0.1 trainer.micro_batch_size=8 -> pack0 member r0",
        "  [1] optim.lr=0.2 trainer.micro_batch_size=8 -> pack0 member r1",
        "2: a run of its own (differs from pack 0 in trainer.micro_batch_size)",
        "  [2] optim.lr=0.1 trainer.micro_batch_size=4 -> 2",
    ]


def test_member_names_are_zero_padded_to_the_sweeps_width():
    assert [pack.member_name(i, 16) for i in (0, 9, 15)] == ["r00", "r09", "r15"]
    assert pack.member_name(0, 1) == "r0"


def test_launch_pack_accepts_off_and_auto_only():
    assert problems(LaunchConfig(pack="auto")) == []
    assert problems(LaunchConfig(pack="on")) == [
        "launch.pack=on: must be one of off, auto (auto packs a -m sweep's runs into ensembles)"
    ]


TINY = ["model=gpt_tiny", "trainer.steps=2", "data=synthetic", "data.seq_len=16"]


def test_a_packed_sweep_is_one_validated_ensemble_job_and_a_pointer_per_run(tmp_path):
    """Composed as the launcher composes it: 4 runs, 2 shapes -> 2 ensemble jobs in
    SWEEP/pack0, SWEEP/pack1; each run's own dir gets packed.json naming its member."""
    overrides = [
        *TINY,
        "launch.pack=auto",
        "seed=0,1",
        "trainer.micro_batch_size=2,4",
        f"hydra.sweep.dir={tmp_path}",
    ]
    runs, cfgs = prepare(expand(overrides, True), True)
    packing = pack_sweep(runs, cfgs)
    assert [r.run_dir for r in packing.runs] == [tmp_path / "pack0", tmp_path / "pack1"]
    first = packing.runs[0].job.trainer
    assert first.ensemble == 2 and first.micro_batch_size == 2
    assert [dict(m) for m in first.members] == [
        {"name": "r0", "seed": 0},
        {"name": "r2", "seed": 1},
    ]
    assert packing.pointers[tmp_path / "3" / pack.POINTER] == {
        "pack_run_dir": str(tmp_path / "pack1"),
        "member": "r3",
        "member_dir": str(tmp_path / "pack1" / "members" / "r3"),
        "overrides": [
            *TINY,
            "launch.pack=auto",
            "seed=1",
            "trainer.micro_batch_size=4",
            f"hydra.sweep.dir={tmp_path}",
        ],
        "data_seed": 0,
        "equals": f"{' '.join(TINY)} seed=1 trainer.micro_batch_size=4 data.order_seed=0",
    }
    # the pack's job orders its data by the first run's seed, for every member
    assert packing.runs[1].job.data.order_seed == 0 and packing.runs[1].job.seed == 0


def test_a_sweep_without_pack_auto_is_not_packed(tmp_path):
    runs, cfgs = prepare(expand([*TINY, "seed=0,1", f"hydra.sweep.dir={tmp_path}"], True), True)
    assert pack_sweep(runs, cfgs) is None


def test_the_launcher_prints_the_packs_and_submits_one_job_per_pack(tmp_path, capsys):
    code = main(
        [
            "-m",
            *TINY,
            "launch.pack=auto",
            "launch.dry_run=true",
            "optim.lr=0.001,0.002",
            "seed=0,1",
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "launch.pack=auto: 1 job(s) for the sweep's runs" in out
    assert "  [3] optim.lr=0.002 seed=1 -> pack0 member r3" in out
    assert out.count("would start") == 1
    assert not (tmp_path / "3" / pack.POINTER).exists()  # a dry run writes nothing


def test_the_pointer_is_plain_json_and_redacts_the_overrides(tmp_path):
    overrides = ["optim.lr=0.1", "WANDB_API_KEY=x"]
    record = pack.pointer(overrides, tmp_path / "pack0", "r1", 0, "optim.lr=0.1 data.order_seed=0")
    assert json.loads(json.dumps(record))["overrides"] == [
        "optim.lr=0.1",
        "WANDB_API_KEY=<redacted>",
    ]
    assert Path(record["member_dir"]) == tmp_path / "pack0" / "members" / "r1"


def test_the_sweep_benchmarks_trials_are_one_pack_of_a_users_tcn(tmp_path, monkeypatch):
    """toolkit bench sweep-pack's sweep (its user TCN on a user dataset, lr x seed) packs into
    one ensemble job whose members carry each trial's seed and learning rate."""
    from toolkit.bench.sweep_pack import FIXTURES, sweep_command

    monkeypatch.syspath_prepend(str(FIXTURES))
    overrides = sweep_command(["0.001", "0.002"], ["0", "1"], steps=2, slurm=False)
    runs, cfgs = prepare(
        expand([*overrides, "launch.pack=auto", f"hydra.sweep.dir={tmp_path}"], True), True
    )
    packing = pack_sweep(runs, cfgs)
    (only,) = packing.runs
    assert only.job.trainer.ensemble == 4
    assert [(m["seed"], m["lr"]) for m in only.job.trainer.members] == [
        (0, 0.001),
        (1, 0.001),
        (0, 0.002),
        (1, 0.002),
    ]
