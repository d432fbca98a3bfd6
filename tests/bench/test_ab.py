"""`python -m toolkit.bench.ab`: one A/B harness whose variants are override lists; its
cases (overhead, watchdog, lowbit, pipeline, telemetry, profiling, tracking, tradeoffs) name
their baseline in code."""

from __future__ import annotations

import json

import pytest

from toolkit.bench import ab

# The harness's runs are checked for their structure and ratios' presence, not their values:
# the slow ones run beside the Slurm tests (scripts/test_suite.py).
pytestmark = pytest.mark.load_tolerant


def test_repetitions_rotate_the_order_so_a_drift_lands_on_each_variant():
    assert ab.interleaved(["a", "b", "c"], 4) == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_step_time_is_the_median_after_warmup():
    # start at 0; steps end at 5 (warm-up), 6, 7, 9, 10: durations 5 | 1, 1, 2, 1
    assert ab.step_seconds([0.0, 5.0, 6.0, 7.0, 9.0, 10.0], warmup=1) == 1.0


def test_divergence_is_max_and_final_abs_delta():
    assert ab.divergence([1.0, 2.5, 3.0], [1.0, 2.0, 3.25]) == {
        "max_abs_delta_loss": 0.5,
        "final_abs_delta_loss": 0.25,
    }


def test_ratios_are_the_median_of_per_repetition_ratios_to_the_baseline():
    runs = {
        "base": [{"step_s": 1.0, "losses": [3.0, 2.0]}, {"step_s": 2.0, "losses": [3.0, 2.0]}],
        "new": [{"step_s": 1.5, "losses": [3.0, 2.5]}, {"step_s": 2.0, "losses": [3.0, 2.5]}],
    }
    summary = ab.summarise(runs, "base")
    assert summary["new"]["step_s_ratio"] == 1.25  # median of 1.5 and 1.0
    assert summary["new"]["step_s_ratio_min_max"] == [1.0, 1.5]
    assert summary["new"]["step_s_median"] == 1.75
    assert summary["new"]["max_abs_delta_loss"] == 0.5
    assert summary["base"]["step_s_ratio"] == 1.0 and summary["base"]["bitwise_reproducible"]


def test_every_case_names_a_baseline_among_its_variants():
    for name, case in ab.CASES.items():
        assert case.baseline in case.variants, name
        assert case.runner in ("ranks", "launch"), name


def test_the_tradeoff_matrix_is_every_combination_with_the_fp32_reference():
    matrix = ab.CASES["tradeoffs"].variants
    assert len(matrix) == 2 * 2 * 2 * 2
    assert matrix["fp32-noac-torch-adamw"] == [
        "precision=fp32",
        "parallel.activation_checkpointing=false",
        "model.kernels=torch",
        "optim=adamw",
    ]
    args = ab.parse_args(["tradeoffs", "--variants", "bf16-ac-*"])
    variants, problems = ab.variants_of(ab.CASES["tradeoffs"], args)
    assert problems == []
    assert list(variants) == [
        "fp32-noac-torch-adamw",  # the baseline runs first, always
        "bf16-ac-torch-adamw",
        "bf16-ac-torch-adamw8bit",
        "bf16-ac-liger-adamw",
        "bf16-ac-liger-adamw8bit",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["overhead", "--reps", "0"], "--reps=0: must be >= 1"),
        (["overhead", "--variants", "nothing*"], "--variants=nothing*: matches none"),
        (["overhead", "--variant", "x"], "--variant=x: must be NAME=OVERRIDE,..."),
    ],
)
def test_bad_arguments_are_one_line_each(argv, message):
    case = ab.CASES[argv[0]]
    assert any(message in line for line in ab.variants_of(case, ab.parse_args(argv))[1])


def test_a_users_model_replaces_the_cases_preset():
    common = ["model=gpt_small", "data.seq_len=128"]
    assert ab.merged(common, ["optim=adamw"], ["model._target_=pkg.Net", "data.seq_len=64"]) == [
        "optim=adamw",
        "model._target_=pkg.Net",
        "data.seq_len=64",
    ]


@pytest.mark.slow
def test_a_variant_that_does_not_compose_is_unavailable_with_the_reason(tmp_path, capsys):
    argv = [
        "lowbit",
        "--variants",
        "x",
        "--variant",
        "x=optim=adamw_nowhere",
        "--out",
        str(tmp_path),
    ]
    assert ab.main([*argv, "--reps", "1", "--steps", "1", "--warmup", "0", *ab.TINY]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["unavailable"]["x"].startswith("optim=adamw_nowhere: no such option in group")
    assert set(result["variants"]) == {"adamw"}  # the baseline ran alone


@pytest.mark.slow
def test_overhead_and_lowbit_in_ranks_report_ratios_and_state_bytes(tmp_path, capsys):
    """The ranks runner: the toolkit's trainer against the bare loop (wall and CPU time), and
    the optimizer state measured from the real tensors."""
    short = ["--reps", "2", "--steps", "3", "--warmup", "1", *ab.TINY]
    assert ab.main(["overhead", "--variants", "toolkit", "--out", str(tmp_path / "o"), *short]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["baseline"] == "bare" and result["world_size"] == 2
    runs = json.loads((tmp_path / "o" / "ab.json").read_text())["runs"]
    assert [r["order"] for r in runs["bare"]] == [["bare", "toolkit"], ["toolkit", "bare"]]
    ratios = [t["step_s"] / b["step_s"] for t, b in zip(runs["toolkit"], runs["bare"], strict=True)]
    assert result["variants"]["toolkit"]["step_s_ratio"] == pytest.approx(sum(ratios) / 2)
    assert result["variants"]["toolkit"]["cpu_s_ratio"] > 0
    assert "model=gpt_tiny" in result["overrides"]["toolkit"]

    short[1] = "1"
    assert ab.main(["lowbit", "--variants", "adamw8bit", "--out", str(tmp_path / "l"), *short]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["variants"]
    assert rows["adamw"]["state_bytes_per_param_median"] == 8.0
    # gpt_tiny's small tensors stay fp32: more than the table's 2.03, much less than adamw
    assert 2.03 < rows["adamw8bit"]["state_bytes_per_param_median"] < 8.0


@pytest.mark.slow
def test_tradeoffs_through_the_launcher_compare_losses_with_the_reference(tmp_path, capsys):
    """The launch runner: the real CLI, one rank; the reference runs twice with the same seed
    and data (bitwise the same losses); bf16 leaves the fp32 curve, a little."""
    argv = ["tradeoffs", "--variants", "bf16-noac-torch-adamw", "--reps", "2", "--steps", "2"]
    assert ab.main([*argv, "--warmup", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["variants"]
    ref, bf16 = rows["fp32-noac-torch-adamw"], rows["bf16-noac-torch-adamw"]
    assert ref["bitwise_reproducible"] is True and ref["max_abs_delta_loss"] == 0.0
    assert 0 < bf16["max_abs_delta_loss"] < 0.5
    assert ref["peak_memory_bytes_median"] > 0 and bf16["step_s_ratio"] > 0
