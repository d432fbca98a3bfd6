"""The CPU validation command's grid and overrides (the measuring itself is a benchmark)."""

from __future__ import annotations

from pathlib import Path

from toolkit.measure.model_check import grid, main, overrides_for


class Args:
    models = "gpt_tiny,gpt_small"
    worlds = "1,2"
    ac = "false,true"
    accum = "1,2"
    profile_dir = Path("/profiles")
    profile = "box_w{world}"
    overrides: list[str] = ["trainer.lr=1e-3"]


def test_the_grid_is_every_combination():
    cells = grid(Args())
    assert len(cells) == 2 * 2 * 2 * 2
    assert cells[0] == ("gpt_tiny", 1, False, 1)
    assert cells[-1] == ("gpt_small", 2, True, 2)


def test_each_run_uses_the_measured_profile_and_its_cell():
    o = overrides_for(Args(), "gpt_125m", 4, True, 2)
    assert "hydra.searchpath=[file:///profiles]" in o
    assert "hardware=box_w4" in o  # the profile measured for the run's world size
    assert {"cluster.tasks_per_node=4", "parallel.activation_checkpointing=true"} <= set(o)
    assert {"trainer.grad_accum=2", "data.seq_len=64", "trainer.lr=1e-3"} <= set(o)


def test_a_profile_is_required(capsys):
    try:
        main(["--models", "gpt_tiny"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "--profile-dir" in capsys.readouterr().err


def test_a_missing_profile_is_one_line_before_anything_runs(tmp_path, capsys):
    code = main(["--profile-dir", str(tmp_path), "--profile", "none", "--models", "gpt_tiny"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.yaml: cannot read the hardware profile" in err[0]
