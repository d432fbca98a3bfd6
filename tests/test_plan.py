"""The planner on synthetic hardware profiles: what cannot fit is excluded, the layout that
should win does, costs are ranked cheapest first."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import GPTConfig, TimeSeriesConfig
from toolkit.measure.plan_check import rank_agreement, spearman
from toolkit.perfmodel import Layout, predict
from toolkit.perfmodel.planner import cost_rows, layouts, rank_plans, spread

SMALL = GPTConfig(name="gpt_small", num_layers=4, dim=192, num_heads=6, vocab_size=256)
# 2 nodes x 4 ranks, sequence 256
BASE = Layout(world_size=8, ranks_per_node=4, micro_batch_size=1, grad_accum=1, seq_len=256)
FAST = HardwareConfig(name="fast", peak_flops_fp32=1e12, memory_bytes=1e12)


def test_layouts_cover_the_global_batch_every_way():
    found = layouts(BASE, 32)  # 4 sequences per rank
    # replicate in {1,2,4,8} x AC x reshard x (accum 1, or accum in {2,4} x grad_sync
    # {last, every} x reshard_between_micro_steps)
    assert len(found) == 4 * 2 * 2 * (1 + 2 * 2 * 2)
    with_accum = {(lay.grad_sync, lay.reshard_between_micro_steps) for lay in found}
    assert with_accum == {("every", True), ("last", True), ("last", False), ("every", False)}
    assert all(lay.grad_sync == "every" for lay in found if lay.grad_accum == 1)
    assert all(lay.micro_batch_size * lay.grad_accum * lay.world_size == 32 for lay in found)
    assert layouts(BASE, 12) == []  # not a multiple of the world size


def test_a_layout_that_cannot_fit_is_excluded():
    everything, dropped = rank_plans(SMALL, BASE, FAST, 64)
    assert dropped == 0
    # the limit sits between the smallest and the largest peak of the layouts
    peaks = sorted(p.prediction.memory["peak_bytes"] for p in everything)
    tight = dataclasses.replace(FAST, memory_bytes=(peaks[0] + peaks[-1]) / 2)
    plans, dropped = rank_plans(SMALL, BASE, tight, 64)
    assert dropped > 0 and plans
    assert all(p.prediction.memory["peak_bytes"] <= tight.memory_bytes for p in plans)


def test_a_slow_inter_node_link_makes_shard_within_node_win():
    slow_nics = dataclasses.replace(FAST, inter_node_bandwidth=1e6, intra_node_bandwidth=1e11)
    plans, _ = rank_plans(SMALL, BASE, slow_nics, 32)
    # FSDP over both nodes all-gathers over the 1 MB/s NICs every micro-step; HSDP with
    # shard groups inside a node only all-reduces gradients across nodes, once per step.
    assert plans[0].layout.shard_size <= BASE.ranks_per_node
    fsdp = [p for p in plans if p.layout.replicate == 1 and p.layout.tp == p.layout.pp == 1]
    assert plans[0].prediction.tokens_per_s > 2 * fsdp[0].prediction.tokens_per_s


def test_costs_rank_the_cheapest_first_and_name_what_does_not_fit():
    slow = dataclasses.replace(FAST, name="slow", peak_flops_fp32=1e11)
    tiny = dataclasses.replace(FAST, name="tiny", memory_bytes=1.0)
    rows = cost_rows(
        SMALL,
        BASE,
        32,
        {"fast": FAST, "slow": slow, "tiny": tiny},
        {"slow": 100.0, "fast": 2.0, "tiny": 0.1},
        1e9,
    )
    assert [r["hardware"] for r in rows] == ["fast", "slow", "tiny"]
    assert rows[-1] == {"hardware": "tiny", "fits": False}
    fast = rows[0]
    assert fast["hours"] == 1e9 / fast["tokens_per_s"] / 3600
    assert fast["cost"] == fast["hours"] * 8 * 2.0


def test_rank_agreement():
    assert rank_agreement([3.0, 2.0, 1.0], [30.0, 20.0, 10.0])
    assert not rank_agreement([3.0, 2.0, 1.0], [20.0, 30.0, 10.0])


def test_spearman_is_one_for_the_predicted_order_and_minus_one_reversed():
    assert spearman([3.0, 2.0, 1.0], [30.0, 20.0, 10.0]) == 1.0
    assert spearman([3.0, 2.0, 1.0], [10.0, 20.0, 30.0]) == -1.0
    # one swap among three: d^2 = 1 + 1 -> 1 - 6*2/(3*8) = 0.5
    assert spearman([3.0, 2.0, 1.0], [20.0, 30.0, 10.0]) == 0.5


def test_a_spread_check_takes_the_best_the_worst_and_evenly_between():
    plans = list(range(9))  # stands for nine ranked plans
    assert spread(plans, 3) == [0, 4, 8]
    assert spread(plans, 2) == [0, 8]
    assert spread(plans, 1) == [0]
    assert spread(plans[:2], 5) == [0, 1]


TINY_CHECK = ["model=gpt_tiny", "cluster.tasks_per_node=1", "trainer.global_batch_size=8"]


def test_check_is_given_the_spread_plans_and_what_they_were_planned_for(monkeypatch):
    from toolkit.measure import plan_check
    from toolkit.plan import main

    given = []

    def check(plans, overrides, steps):  # stands for the runs of toolkit.measure.plan_check
        given.append((plans, overrides, steps))
        return 0

    monkeypatch.setattr(plan_check, "check", check)
    argv = ["--check", "2", "--spread", "--steps", "3", *TINY_CHECK, "data.seq_len=32"]
    assert main(argv) == 0
    plans, overrides, steps = given[0]
    best, worst = (p.prediction.tokens_per_s for p in plans)
    assert best > worst and steps == 3
    assert overrides == [*TINY_CHECK, "data.seq_len=32"]


def test_run_plan_runs_the_benchmark_with_the_plans_overrides_and_reads_its_result(
    tmp_path, monkeypatch
):
    import toolkit.measure.run as bench
    from toolkit.measure.plan_check import run_plan

    argvs, codes = [], [0, 3]

    def benchmark(argv: list[str]) -> int:  # stands for a run: writes its one-line summary
        argvs.append(argv)
        out = tmp_path / f"run{len(argvs)}"
        out.mkdir()
        if codes[len(argvs) - 1] == 0:
            (out / "bench.json").write_text('{"tokens_per_s": 5.0}\n')
        return codes[len(argvs) - 1]

    monkeypatch.setattr(bench, "main", benchmark)
    assert run_plan(["a=1", "b=2"], tmp_path / "run1", steps=4, warmup=1) == (
        0,
        {"tokens_per_s": 5.0},
    )
    assert argvs[0] == [
        "--warmup",
        "1",
        "--steps",
        "4",
        "--out",
        str(tmp_path / "run1"),
        "a=1",
        "b=2",
    ]
    assert run_plan(["a=1"], tmp_path / "run2", steps=4) == (3, None)  # a failed run


def test_cli_prints_the_top_plans_with_their_overrides():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.plan",
            "--top",
            "3",
            "model=gpt_tiny",
            "cluster.tasks_per_node=2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "trainer.micro_batch_size=" in proc.stdout
    assert "layouts fit" in proc.stdout


# -- tensor and pipeline parallelism ---------------------------------------------------------
WIDE = GPTConfig(name="wide", num_layers=8, dim=256, num_heads=8, vocab_size=8192)
NODE4 = Layout(world_size=8, ranks_per_node=4, micro_batch_size=1, grad_accum=1, seq_len=1024)


def test_layouts_enumerate_tp_inside_a_node_and_pp_dividing_the_layers():
    found = layouts(NODE4, 16, WIDE)
    assert {lay.tp for lay in found} == {1, 2, 4}  # divisors of 4 ranks per node
    assert {lay.pp for lay in found} == {1, 2, 4, 8}  # divide 8 layers and the ranks
    assert all(lay.tp <= NODE4.ranks_per_node for lay in found)
    for lay in found:
        assert lay.micro_batch_size * lay.grad_accum * lay.dp == 16
        if lay.pp > 1 and lay.pp_schedule != "gpipe":
            assert lay.grad_accum >= lay.pp * lay.virtual_stages
    # tp must split the heads: 6 heads on 4 ranks is not offered
    assert {lay.tp for lay in layouts(NODE4, 16, SMALL)} == {1, 2}


def test_every_plan_passes_the_launchers_parallel_checks():
    from toolkit.config.parallel import ParallelConfig, problems

    for lay in layouts(NODE4, 16, WIDE):
        par = ParallelConfig(
            dp_replicate=lay.replicate,
            dp_shard=lay.shard_size,
            tp=lay.tp,
            pp=lay.pp,
            pp_schedule=lay.pp_schedule,
            pp_virtual_stages=lay.pp_virtual_stages,
        )
        assert problems(par, lay.world_size, WIDE, lay.grad_accum) == [], lay


def test_a_model_that_does_not_fit_with_fsdp_alone_gets_a_tp_or_pp_plan():
    everything, _ = rank_plans(WIDE, NODE4, FAST, 8)
    fsdp = [p for p in everything if p.layout.tp == p.layout.pp == 1]
    # the limit sits under the smallest FSDP-only peak (activations and logits of one
    # sequence do not shard over dp) and above the smallest peak of the others
    least_fsdp = min(p.prediction.memory["peak_bytes"] for p in fsdp)
    least = min(p.prediction.memory["peak_bytes"] for p in everything)
    assert least < least_fsdp
    small = dataclasses.replace(FAST, memory_bytes=(least + least_fsdp) / 2)
    plans, dropped = rank_plans(WIDE, NODE4, small, 8)
    assert plans and dropped >= len(fsdp)
    assert all(p.layout.tp > 1 or p.layout.pp > 1 for p in plans)
    assert "parallel.tp=" in " ".join(plans[0].overrides())


def test_tp_inside_a_node_ranks_above_tp_across_nodes():
    hw = dataclasses.replace(FAST, intra_node_bandwidth=1e11, inter_node_bandwidth=1e8)
    inside = dataclasses.replace(NODE4, micro_batch_size=1, tp=4)
    across = dataclasses.replace(inside, ranks_per_node=2)  # the same tp=4 over 2 nodes
    t_in = predict(WIDE, inside, hw).tokens_per_s
    t_across = predict(WIDE, across, hw).tokens_per_s
    assert t_in > 2 * t_across
    # and the planner never offers a tp group wider than a node
    two_per_node = dataclasses.replace(NODE4, ranks_per_node=2)
    assert max(p.layout.tp for p in rank_plans(WIDE, two_per_node, hw, 8)[0]) == 2


def test_a_pipeline_with_more_micro_batches_wins_over_one_with_a_big_bubble():
    hw = dataclasses.replace(FAST, memory_bytes=1e12)
    plans, _ = rank_plans(WIDE, NODE4, hw, 32)
    pp4 = [
        p for p in plans if p.layout.pp == 4 and p.layout.tp == 2 and p.layout.pp_schedule == "1f1b"
    ]
    by_m = {p.layout.grad_accum: p for p in pp4 if not p.layout.activation_checkpointing}
    # m = 4 micro-batches: bubble 3/7; m = 16: 3/19
    assert by_m[16].prediction.time["bubble_fraction"] == 3 / 19
    assert by_m[4].prediction.time["bubble_fraction"] == 3 / 7
    # (16 + 3) stage-times of 2 sequences against (4 + 3) of 8: the longer pipeline wins
    assert by_m[16].prediction.tokens_per_s > 1.2 * by_m[4].prediction.tokens_per_s


@pytest.mark.slow
def test_check_runs_a_spread_of_plans_and_says_whether_the_order_holds(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.plan",
            "--top",
            "3",
            "--check",
            "2",
            "--spread",
            "--steps",
            "2",
            "model=gpt_tiny",
            "cluster.tasks_per_node=1",
            "trainer.global_batch_size=8",
            "data.seq_len=32",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line[:2] in ("1 ", "2 ")]
    assert len(rows) == 2  # the best plan and the worst, each measured
    assert all("trainer.grad_accum=" in r and float(r.split("|")[-1]) > 0 for r in rows)
    assert "Spearman rank correlation" in proc.stdout


# -- memory options: fused cross-entropy and 8-bit optimizer states ------------------------
BIG_VOCAB = GPTConfig(name="big_vocab", num_layers=2, dim=256, num_heads=4, vocab_size=65536)
ONE_GPU = Layout(world_size=1, ranks_per_node=1, micro_batch_size=1, grad_accum=1, seq_len=1024)
GPU = HardwareConfig(name="synthetic_gpu", peak_flops_fp32=1e14, memory_bytes=1e12)


def options_of(plan) -> tuple[str, str]:
    return plan.layout.kernels, plan.layout.optimizer


def test_when_memory_binds_the_plan_uses_fused_loss_and_8bit_states(capsys):
    from toolkit.perfmodel.planner import KERNEL_OPTIONS, OPTIMIZER_OPTIONS
    from toolkit.plan import print_plans

    everything, _ = rank_plans(BIG_VOCAB, ONE_GPU, GPU, 4, KERNEL_OPTIONS, OPTIMIZER_OPTIONS)
    least = {}
    for p in everything:
        key = options_of(p)
        least[key] = min(least.get(key, float("inf")), p.prediction.memory["peak_bytes"])
    # fp32 AdamW with the full logits needs the most; either option alone is not enough to
    # reach what both together reach
    both = least[("liger", "adamw8bit")]
    others = min(least[k] for k in least if k != ("liger", "adamw8bit"))
    assert both < others < least[("torch", "adamw")] + 1
    tight = dataclasses.replace(GPU, memory_bytes=(both + others) / 2)
    plans, dropped = rank_plans(BIG_VOCAB, ONE_GPU, tight, 4, KERNEL_OPTIONS, OPTIMIZER_OPTIONS)
    assert plans and dropped
    assert {options_of(p) for p in plans} == {("liger", "adamw8bit")}
    assert plans[0].overrides()[-2:] == ["model.kernels=liger", "optim=adamw8bit"]
    print_plans(plans, dropped, 1, "tight")
    assert "model.kernels=liger optim=adamw8bit" in capsys.readouterr().out


def test_when_everything_fits_the_default_stays_first():
    from toolkit.perfmodel.planner import KERNEL_OPTIONS, OPTIMIZER_OPTIONS

    plans, dropped = rank_plans(BIG_VOCAB, ONE_GPU, GPU, 4, KERNEL_OPTIONS, OPTIMIZER_OPTIONS)
    assert dropped == 0
    assert options_of(plans[0]) == ("torch", "adamw")  # the options are not faster in the model
    assert not any(o.startswith(("model.kernels=", "optim=")) for o in plans[0].overrides())
    # each layout is offered with all four pairs
    assert len(plans) == 4 * len(layouts(ONE_GPU, 4, BIG_VOCAB))


def test_liger_is_offered_only_without_tensor_parallelism():
    from toolkit.perfmodel.planner import KERNEL_OPTIONS, OPTIMIZER_OPTIONS

    found = layouts(NODE4, 16, WIDE, KERNEL_OPTIONS, OPTIMIZER_OPTIONS)
    assert {lay.tp for lay in found if lay.kernels == "liger"} == {1}
    assert {lay.optimizer for lay in found if lay.tp > 1} == {"adamw", "adamw8bit"}
    shape = {f: getattr(WIDE, f) for f in ("name", "num_layers", "dim", "num_heads")}
    ts = TimeSeriesConfig(**shape, num_series=4)
    assert {lay.kernels for lay in layouts(NODE4, 16, ts, KERNEL_OPTIONS)} == {"torch"}


def test_memory_options_need_a_gpu_and_their_code(monkeypatch):
    import toolkit.config.compose as compose
    import toolkit.kernels.backend as backend
    from toolkit.config.job import JobConfig
    from toolkit.perfmodel.planner import memory_options

    job = JobConfig()
    assert memory_options(job) == (("torch",), ("adamw",), ["memory options: GPU jobs only"])
    job.cluster.gpus_per_node = 8
    monkeypatch.setattr(backend, "importable", lambda name: False)
    kernels, optimizers, skipped = memory_options(job)
    assert (kernels, optimizers) == (("torch",), ("adamw",))
    assert any("model.kernels=liger" in line for line in skipped)
    monkeypatch.setattr(backend, "importable", lambda name: True)
    monkeypatch.setattr(compose, "group_options", lambda group: ["adamw", "adamw8bit"])
    assert memory_options(job) == (("torch", "liger"), ("adamw", "adamw8bit"), [])


def test_the_overrides_of_a_memory_bound_plan_compose():
    from toolkit.config.compose import compose_raw, to_job
    from toolkit.perfmodel.planner import KERNEL_OPTIONS, OPTIMIZER_OPTIONS

    plans, _ = rank_plans(BIG_VOCAB, ONE_GPU, GPU, 4, KERNEL_OPTIONS, OPTIMIZER_OPTIONS)
    fused = next(p for p in plans if options_of(p) == ("liger", "adamw8bit"))
    overrides = fused.overrides()
    job = to_job(compose_raw(["model=gpt_tiny", *overrides]))
    assert (job.model.kernels, job.optim.name) == ("liger", "adamw8bit")


# -- defaults a GPU user expects ----------------------------------------------------------
def plan_cli(capsys, *args: str) -> str:
    from toolkit.plan import main

    assert main(["--top", "1", *args]) == 0
    return capsys.readouterr().out


def test_on_a_gpu_preset_the_plan_is_bf16_at_the_models_sequence_length(capsys):
    out = plan_cli(capsys, "model=gpt_small", "hardware=h100", "cluster.tasks_per_node=8")
    assert "precision: bf16 (a GPU preset, h100" in out
    assert "sequence length: 512, the model's max_seq_len" in out  # not data.seq_len's 128
    # the global batch it planned for, and where it came from: 8 x 1 x 8 sequences
    assert "planned for a global batch of 64 sequences x 512 tokens = 32,768 tokens" in out
    assert "gpt_small on 8 x h100, bf16, global batch 64 x 512 tokens" in out


def test_what_the_user_sets_wins_over_the_planners_defaults(capsys):
    out = plan_cli(capsys, "--seq-len", "256", "model=gpt_small", "hardware=h100", "precision=fp32")
    assert "precision: bf16" not in out and "sequence length:" not in out
    assert ", fp32, global batch" in out and "x 256 tokens" in out
    out = plan_cli(capsys, "model=gpt_small", "hardware=h100", "data.seq_len=64")
    assert "x 64 tokens" in out


def test_the_title_names_the_shape_planned_when_overrides_change_it(capsys):
    out = plan_cli(capsys, "model=gpt_small", "model.dim=256", "model.num_layers=2")
    assert "gpt_small (overridden: dim=256, num_layers=2) on" in out
