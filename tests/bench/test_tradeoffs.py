"""`python -m toolkit.bench.tradeoffs` end to end on gpt_tiny (real launcher, one CPU rank):
the settings whose code is on this branch run and are compared with the fp32 reference; the
others are listed with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.bench.tradeoffs import MATRIX, REFERENCE, check_args, divergence, parse_args, select

REPO = Path(__file__).resolve().parents[2]


def test_the_matrix_is_every_combination_and_the_reference_always_runs_first():
    assert len(MATRIX) == 2 * 2 * 2 * 2
    assert len({s.name for s in MATRIX}) == 16
    assert [s.name for s in select("bf16-ac-*")] == [
        REFERENCE,
        "bf16-ac-torch-adamw",
        "bf16-ac-torch-adamw8bit",
        "bf16-ac-liger-adamw",
        "bf16-ac-liger-adamw8bit",
    ]
    assert select(REFERENCE)[0].overrides() == [
        "precision=fp32",
        "parallel.activation_checkpointing=false",
        "model.kernels=torch",
        "optim=adamw",
    ]


def test_divergence_is_max_and_final_abs_delta():
    assert divergence([1.0, 2.5, 3.0], [1.0, 2.0, 3.25]) == {
        "max_abs_delta_loss": 0.5,
        "final_abs_delta_loss": 0.25,
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "gpt_huge"], "--models: gpt_huge unknown"),
        (["--settings", "fp64-*"], "--settings=fp64-*: matches none"),
        (["--steps", "0"], "--steps=0: must be >= 1"),
        (["--rounds", "0"], "--rounds=0: must be >= 1"),
        (["--settings", "bf16-*", "--repeat", "fp32-ac-torch-adamw"], "--repeat="),
        (["precision=bf16"], "precision=bf16: set by the matrix"),
    ],
)
def test_bad_arguments_are_one_line_each(argv, message):
    assert any(message in line for line in check_args(parse_args(argv)))


@pytest.mark.slow
def test_matrix_end_to_end_on_gpt_tiny(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("cpu: 1.0\nh100: 3.0\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), TOOLKIT_CACHE=str(tmp_path))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.bench.tradeoffs",
            "--models",
            "gpt_tiny",
            "--settings",
            "bf16-noac-torch-adamw",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--cost",
            str(prices),
            "--out",
            str(out),
            "cluster.tasks_per_node=1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "tradeoffs.json").read_text())
    rows = {r["setting"]: r for r in result["rows"]}
    assert list(rows)[0] == REFERENCE  # first: the others are compared with it
    assert set(rows) == {REFERENCE, "bf16-noac-torch-adamw"}
    ref, bf16 = rows[REFERENCE], rows["bf16-noac-torch-adamw"]
    # the reference ran twice with the same seed and data: bitwise the same losses
    assert ref["bitwise_reproducible"] is True
    assert ref["runs"] == len(ref["step_time_s_runs"]) == 2 and bf16["runs"] == 1
    assert ref["step_time_s_median"] == pytest.approx(sum(ref["step_time_s_runs"]) / 2)
    assert ref["max_abs_delta_loss"] == ref["final_abs_delta_loss"] == 0.0
    # the same tokens for every setting; bf16 leaves the fp32 curve, a little
    assert ref["tokens"] == bf16["tokens"] == 3 * 8 * 128
    assert len(bf16["losses"]) == 3
    assert 0 < bf16["max_abs_delta_loss"] < 0.5
    assert bf16["max_abs_delta_loss"] == max(
        abs(a - b) for a, b in zip(bf16["losses"], ref["losses"], strict=True)
    )
    for r in (ref, bf16):
        assert r["step_time_s_median"] > 0 and r["peak_memory_bytes"] > 0 and r["val_loss"] > 0
        assert r["predicted_peak_memory_bytes"] > 0
        # 1.0 per device-hour on the run's cpu preset, one rank
        assert r["cost_per_mtok_measured"] == pytest.approx(1.0 / 3600 / r["tokens_per_s"] * 1e6)
        assert r["cost_per_mtok_predicted_h100"] > 0
    table = (out / "tradeoffs.md").read_text()
    assert "| gpt_tiny | bf16-noac-torch-adamw |" in table and "identical" in table
    assert (out / "tradeoffs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "load average" in proc.stdout


def test_a_setting_whose_code_is_missing_is_unavailable_with_the_reason(monkeypatch):
    import toolkit.kernels.backend as backend
    from toolkit.bench.tradeoffs import Setting, unavailable
    from toolkit.bench.tradeoffs_report import table

    model = ["model=gpt_tiny"]
    monkeypatch.setattr(backend, "importable", lambda name: name != "toolkit.kernels.liger")
    why = unavailable(Setting("fp32", "noac", "liger", "adamw"), model)
    assert why == "model.kernels=liger: toolkit.kernels.liger is not installed on this branch"
    # an optimizer without its conf/optim preset does not compose
    why = unavailable(Setting("fp32", "noac", "torch", "adamw_nowhere"), model)
    assert why.startswith("config: optim=adamw_nowhere: no such option in group 'optim'")
    assert unavailable(Setting("bf16", "ac", "torch", "adamw"), model) == ""
    row = {"model": "gpt_tiny", "setting": "x", "status": "unavailable", "reason": why}
    assert f"| gpt_tiny | x | unavailable: {why} |" in table([row], {})
