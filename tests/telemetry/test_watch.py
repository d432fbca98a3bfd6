"""`watch --once`: one snapshot of the files as they are now."""

from __future__ import annotations

from toolkit.telemetry.cli import main
from toolkit.telemetry.synthetic import Plan, generate


def test_watch_once_shows_every_node_and_rank(tmp_path, capsys):
    generate(
        tmp_path,
        Plan(
            nodes=2, gpus_per_node=2, duration_s=60.0, idle_gap_at_s=None, checkpoint_every_s=1000.0
        ),
    )
    assert main(["watch", str(tmp_path), "--once"]) == 0
    out = capsys.readouterr().out
    assert "gpu-node000" in out and "gpu-node001" in out
    assert "Ranks (last 20 steps)" in out
    for rank in range(4):
        assert f"│ {rank} " in out or f" {rank} │" in out


def test_watch_without_telemetry_fails_with_one_line(tmp_path, capsys):
    assert main(["watch", str(tmp_path), "--once"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
