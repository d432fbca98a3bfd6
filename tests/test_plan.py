"""The planner on synthetic hardware profiles: what cannot fit is excluded, the layout that
should win does, costs are ranked cheapest first."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import ModelConfig
from toolkit.perfmodel import Layout
from toolkit.plan import cost_rows, layouts, rank_agreement, rank_plans

SMALL = ModelConfig(name="gpt_small", num_layers=4, dim=192, num_heads=6, vocab_size=256)
# 2 nodes x 4 ranks, sequence 256
BASE = Layout(world_size=8, ranks_per_node=4, micro_batch_size=1, grad_accum=1, seq_len=256)
FAST = HardwareConfig(name="fast", peak_flops_fp32=1e12, memory_bytes=1e12)


def test_layouts_cover_the_global_batch_every_way():
    found = layouts(BASE, 32)  # 4 sequences per rank
    # replicate in {1,2,4,8} x accum in {1,2,4} x AC x reshard
    assert len(found) == 4 * 3 * 2 * 2
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
    fsdp = [p for p in plans if p.layout.replicate == 1]
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
